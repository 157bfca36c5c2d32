"""default_hooks override rules and custom_hooks registration (names, priorities)."""
import pytest

from distributed_runner.core.errors import ConfigError
from hooks import HOOKS, CheckpointHook, Hook, LoggerHook
from tests.toy import make_runner


def names(runner):
    return [(e.name, type(e.hook).__name__, e.priority) for e in runner._hooks.entries]


def test_seven_defaults_with_seed_priorities(tmp_path):
    runner = make_runner(tmp_path, default_hooks=None)
    assert names(runner) == [
        ("runtime_info", "RuntimeInfoHook", 10), ("timer", "IterTimerHook", 50),
        ("sampler_seed", "DistSamplerSeedHook", 50), ("logger", "LoggerHook", 60),
        ("param_scheduler", "ParamSchedulerHook", 70), ("checkpoint", "CheckpointHook", 90),
        ("straggler", "StragglerHook", 90)]


def test_none_removes_dict_updates_type_replaces_new_name_adds(tmp_path):
    @HOOKS.register_module(force=True)
    class MyLoggerHook(LoggerHook):
        pass

    @HOOKS.register_module(force=True)
    class ExtraHook(Hook):
        priority = "HIGH"

    runner = make_runner(tmp_path, default_hooks=dict(
        timer=None,                                     # removed
        checkpoint=dict(interval=7),                    # arguments updated
        logger=dict(type="MyLoggerHook", interval=3),   # replaced
        extra=dict(type="ExtraHook")))                  # added
    entries = {e.name: e for e in runner._hooks.entries}
    assert "timer" not in entries
    assert isinstance(entries["checkpoint"].hook, CheckpointHook)
    assert entries["checkpoint"].hook.interval == 7
    assert type(entries["logger"].hook).__name__ == "MyLoggerHook"
    assert entries["logger"].hook.interval == 3
    assert entries["extra"].priority == 30


def test_custom_hook_names_default_and_explicit(tmp_path):
    @HOOKS.register_module(force=True)
    class CountingHook(Hook):
        pass

    runner = make_runner(tmp_path, custom_hooks=[
        dict(type="CountingHook"), dict(type="CountingHook"),
        dict(type="CountingHook", name="mine", priority="lowest")])
    got = [(e.name, e.priority) for e in runner._hooks.entries if e.name.startswith(("count", "mine"))]
    assert got == [("counting", 50), ("counting_1", 50), ("mine", 100)]


def test_unknown_hook_argument_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        make_runner(tmp_path, default_hooks=dict(checkpoint=dict(intervall=3)))
    msg = str(err.value)
    assert msg.startswith("default_hooks.checkpoint.intervall:")
    assert "did you mean 'interval'" in msg and "\n" not in msg


def test_missing_hook_argument_is_one_line(tmp_path):
    @HOOKS.register_module(force=True)
    class NeedsArgHook(Hook):
        def __init__(self, threshold):
            self.threshold = threshold

    with pytest.raises(ConfigError, match=r"custom_hooks\[0\]\.threshold: NeedsArgHook needs "
                                          r"argument 'threshold'"):
        make_runner(tmp_path, custom_hooks=[dict(type="NeedsArgHook")])


def test_unknown_hook_type_names_closest(tmp_path):
    with pytest.raises(ConfigError) as err:
        make_runner(tmp_path, custom_hooks=[dict(type="CheckpiontHook")])
    assert "custom_hooks[0].type: unknown hook 'CheckpiontHook'" in str(err.value)
    assert "'CheckpointHook'" in str(err.value)


def test_bad_priority_in_config(tmp_path):
    with pytest.raises(ConfigError, match=r"custom_hooks\[0\]\.priority: unknown priority"):
        make_runner(tmp_path, custom_hooks=[dict(type="IterTimerHook", priority="URGENT")])
