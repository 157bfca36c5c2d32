"""The dispatcher's cross-cutting policies: error policy, ordering constraints, always-on timing."""

import pytest

import tests.hook_probes  # noqa: F401
from distributed_runner.cli import main as drun
from distributed_runner.core.errors import ConfigError
from distributed_runner.engine.dispatch import HookDispatcher
from hooks import HOOKS, Hook
from tests.toy import ListSink, make_runner


class Holder:
    pass


@HOOKS.register_module(force=True)
class FailingHook(Hook):
    """Raises at after_train_iter from iteration ``from_iter`` on."""

    def __init__(self, from_iter: int = 1) -> None:
        self.from_iter, self.calls = from_iter, 0

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.calls += 1
        if runner.iter + 1 >= self.from_iter:
            raise RuntimeError("broken sink")


class Named(Hook):
    def __init__(self, log, tag, priority="NORMAL"):
        self.log, self.tag, self.priority = log, tag, priority

    def before_train(self, runner):
        self.log.append(self.tag)


def test_raise_is_the_default_and_names_the_hook(tmp_path):
    runner = make_runner(tmp_path, custom_hooks=[dict(type="FailingHook", from_iter=3)])
    with pytest.raises(RuntimeError, match="broken sink") as info:
        runner.train()
    assert any("hook 'failing'" in note and "after_train_iter" in note
               for note in info.value.__notes__)
    assert runner.iter == 2


def test_warn_reports_once_counts_the_rest_and_training_finishes(tmp_path, runlog):
    runner = make_runner(tmp_path, custom_hooks=[dict(type="FailingHook", on_error="warn")])
    runner.train()
    assert runner.iter == 30
    warnings = [r for r in runlog.records if "'failing' (FailingHook)" in r.getMessage()]
    assert len(warnings) == 1 and "on_error='warn'" in warnings[0].getMessage()
    row = next(t for t in runner.hook_timings() if t.name == "failing")
    assert row.errors == 30 and row.mount == "after_train_iter"


def test_disable_removes_the_hook_after_its_first_failure(tmp_path):
    runner = make_runner(tmp_path, custom_hooks=[dict(type="FailingHook", on_error="disable",
                                                      from_iter=4)])
    runner.train()
    hook = runner.get_hook("failing")
    assert hook.calls == 4 and runner.iter == 30
    assert "DISABLED" in runner.hook_plan()
    row = next(t for t in runner.hook_timings() if t.name == "failing")
    assert (row.calls, row.errors) == (4, 1)


class _After(Hook):
    """Counts its after_train_iter calls; runs after FailingHook (lower priority)."""

    priority = "LOW"

    def __init__(self) -> None:
        self.calls = 0

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.calls += 1


def test_failures_on_the_untimed_path_follow_the_same_policies(tmp_path):
    # after its first 16 calls a mount point mostly runs through its generated caller
    # (dispatch.compile_caller): a failure there must apply the hook's policy, still call the hooks after
    # it, and a disabled hook must leave the callers the loop holds
    from distributed_runner.engine.dispatch import _TIMED
    assert not _TIMED[37]  # the 37th call takes the untimed path
    after = _After()
    runner = make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=6),
                         custom_hooks=[dict(type="FailingHook", on_error="disable", from_iter=37),
                                       after])
    runner.train()
    assert runner.get_hook("failing").calls == 37 and after.calls == 60 and runner.iter == 60
    runner = make_runner(tmp_path / "warn", train_cfg=dict(by_epoch=True, max_epochs=6),
                         custom_hooks=[dict(type="FailingHook", on_error="warn", from_iter=37),
                                       after := _After()])
    runner.train()
    row = next(t for t in runner.hook_timings() if t.name == "failing")
    assert (row.calls, row.errors, after.calls) == (60, 24, 60)


def test_class_default_policy_and_config_key_wins(tmp_path):
    class Quiet(FailingHook):
        on_error = "warn"

    d = HookDispatcher(Holder())
    d.register(Quiet(), "quiet")
    d.register(Quiet(), "loud", on_error="raise")
    assert [e.on_error for e in d.entries] == ["warn", "raise"]
    with pytest.raises(ConfigError, match=r"x\.on_error: unknown policy 'ignore'"):
        d.register(Quiet(), "x", on_error="ignore")


def test_optional_built_ins_warn_and_essential_ones_raise():
    import hooks
    assert hooks.LoggerHook.on_error == hooks.VisualizationHook.on_error == "warn"
    assert hooks.ProfilerHook.on_error == "warn"
    for cls in (hooks.CheckpointHook, hooks.EMAHook, hooks.ParamSchedulerHook,
                hooks.NonFiniteLossHook):
        assert cls.on_error == "raise"


def test_a_failing_sink_does_not_silence_the_others(tmp_path, runlog):
    class BrokenSink(ListSink):
        def write(self, record):
            raise OSError("disk full")

    good = ListSink()
    runner = make_runner(tmp_path, default_hooks=dict(
        logger=dict(type="LoggerHook", interval=5, sinks=[BrokenSink(), good])))
    runner.train()
    assert len([r for r in good.records if r.mode == "train"]) == 6
    assert sum("BrokenSink failed" in r.getMessage() for r in runlog.records) == 1


# -- ordering constraints ------------------------------------------------------------------------
def test_after_and_before_refine_the_order_inside_a_priority():
    log = []
    d = HookDispatcher(Holder())
    d.register(Named(log, "c"), "c", after=["b"], strict=False)
    d.register(Named(log, "a"), "a")
    d.register(Named(log, "b"), "b", after="a")
    d.register(Named(log, "first"), "first", before=["c", "a"])
    d.register(Named(log, "low", "LOW"), "low")
    d.check()
    d.call("before_train")
    assert log == ["first", "a", "b", "c", "low"]
    assert "after=b" in d.plan_text() and "before=c,a" in d.plan_text()


def test_unknown_names_cycles_and_contradicted_priorities_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"custom_hooks\[0\]\.after: no hook named 'emma'.*"
                                          r"did you mean 'ema'"):
        make_runner(tmp_path, custom_hooks=[dict(type="EmptyCacheHook", after=["emma"]),
                                            dict(type="EMAHook")])
    with pytest.raises(ConfigError, match=r"cycle: .*(ema -> empty_cache -> ema|"
                                          r"empty_cache -> ema -> empty_cache)"):
        make_runner(tmp_path, custom_hooks=[dict(type="EmptyCacheHook", after=["ema"]),
                                            dict(type="EMAHook", after=["empty_cache"])])
    with pytest.raises(ConfigError, match=r"'checkpoint' \(VERY_LOW \(90\)\) cannot run before "
                                          r"'empty_cache' \(NORMAL \(50\)\)"):
        make_runner(tmp_path, custom_hooks=[dict(type="EmptyCacheHook", after=["checkpoint"])])
    with pytest.raises(ConfigError, match="must be a hook name or a list"):
        make_runner(tmp_path, custom_hooks=[dict(type="EmptyCacheHook", after=3)])


def test_drun_hooks_prints_the_constrained_order(tmp_path, capsys):
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "custom_imports = ['tests.toy']\n"
        "model = dict(type='ToyModel')\nwork_dir = 'wd'\n"
        "custom_hooks = [dict(type='EmptyCacheHook', after=['ema']), dict(type='EMAHook')]\n")
    assert drun(["hooks", str(cfg)]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.strip().startswith("after_train_iter"))
    assert line.index("ema (50)") < line.index("empty_cache (50)")
    assert "after=ema" in out


# -- timing --------------------------------------------------------------------------------------
def test_timing_is_per_hook_and_mount_point_and_reported(tmp_path, runlog):
    sink = ListSink()
    runner = make_runner(tmp_path, custom_hooks=[dict(type="SleepHook", seconds=0.01)],
                         default_hooks=dict(logger=dict(type="LoggerHook", interval=5,
                                                        sinks=[sink], hook_time_warn_share=0.2,
                                                        hook_time_warn_seconds=0.1,
                                                        top_hooks=3)),
                         log_level="INFO")
    runner.train()
    rows = {(t.name, t.mount): t for t in runner.hook_timings()}
    sleep = rows[("sleep", "after_train_iter")]
    assert sleep.calls == 30 and sleep.seconds >= 30 * 0.01
    assert rows[("logger", "after_train_iter")].calls == 30
    assert runner.hook_timings()[0].name == "sleep"  # slowest first
    train = [r for r in sink.records if r.mode == "train"]
    for record in train:  # the slowest hooks of each window, in us per iteration
        top = dict(record.info["hooks"])
        assert len(top) == 3 and top["sleep"] >= 10_000
    messages = [r.getMessage() for r in runlog.records]
    assert sum("hook 'sleep' took" in m for m in messages) == 1
    table = next(m for m in messages if m.startswith("Hook time"))
    assert "sleep" in table and "after_train_iter" in table
