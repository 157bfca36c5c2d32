"""Dispatch tables: priority order, stable ties, only implementers, the plan."""
import pytest

from distributed_runner.core.errors import ConfigError
from distributed_runner.engine.dispatch import HookDispatcher
from hooks import Hook, Priority


class Log(Hook):
    def __init__(self, name, log, priority=None):
        self.name, self.log = name, log
        if priority is not None:
            self.priority = priority

    def before_train(self, runner):
        self.log.append(self.name)


class Silent(Hook):
    pass


class Holder:
    pass


def test_priority_order_and_stable_ties():
    log, holder = [], Holder()
    d = HookDispatcher(holder)
    d.register(Log("low", log, "LOW"), "low")
    d.register(Log("a", log), "a")
    d.register(Log("highest", log, Priority.HIGHEST), "highest")
    d.register(Log("b", log, 50), "b")
    d.register(Log("config", log, "LOW"), "config", priority=1)  # config priority wins
    d.call("before_train")
    assert log == ["highest", "config", "a", "b", "low"]


def test_tables_hold_only_hooks_that_override():
    holder = Holder()
    d = HookDispatcher(holder)
    log = []
    for i in range(48):
        d.register(Silent(), f"silent{i}")
    d.register(Log("x", log), "x")
    d.register(Log("y", log), "y")
    assert len(d._tables["before_train"]) == 2
    assert all(len(d._tables[m]) == 0 for m in d._tables if m != "before_train")
    assert d.plan() == {"before_train": [("x", 50), ("y", 50)]}


def test_duplicate_name_and_non_hook_rejected():
    d = HookDispatcher(Holder())
    d.register(Silent(), "x")
    with pytest.raises(ConfigError, match="already registered"):
        d.register(Silent(), "x")
    with pytest.raises(ConfigError, match="not a Hook"):
        d.register(object(), "y")


def test_bracket_calls_after_on_failure_and_keeps_the_original_error():
    log = []

    class Boom(Hook):
        def after_train(self, runner):
            log.append("after_train")
            raise RuntimeError("sink failed")

    d = HookDispatcher(Holder())
    d.register(Boom(), "boom")
    with pytest.raises(ValueError, match="training died"):
        with d.bracket("before_train", "after_train"):
            raise ValueError("training died")
    assert log == ["after_train"]


def test_plan_text_lists_hooks_and_mount_points():
    d = HookDispatcher(Holder())
    d.register(Log("x", []), "my_hook", priority="HIGH")
    text = d.plan_text()
    assert "my_hook" in text and "HIGH (30)" in text and "before_train" in text
