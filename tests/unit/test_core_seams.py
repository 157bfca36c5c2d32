"""The core's seams: one TrainState, sinks as the Runner's service, declared extension points,
argument errors at their real config path, import hygiene, and the bugs found reading the core
(TTA eval mode, late requests)."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tests.hook_probes  # noqa: F401  (RequestHook)
from distributed_runner.cli import main as drun_main
from distributed_runner.core.errors import ConfigError
from distributed_runner.engine.train_state import TrainState
from distributed_runner.launch.launcher import validate_config
from distributed_runner.tracking.sinks import JsonlSink, LogRecord
from hooks import CheckpointSaver, Hook, StepGuard
from tests.docs_blocks import docs_block, docs_text
from tests.toy import ListSink, base_cfg, make_runner

ROOT = Path(__file__).resolve().parents[2]


# -- TrainState ----------------------------------------------------------------------------------
def test_train_state_records_a_finishing_step_as_done_and_restores_it():
    s = TrainState(max_epochs=3, max_iters=30, by_epoch=True, epoch=1, iter=12, data_epoch=1,
                   batch_in_epoch=2)
    assert s.position() == {"epoch": 1, "iter": 12, "iter_in_epoch": 2, "val_pending": False, "epoch_offset": 0}
    s.finishing("iter")  # inside after_train_iter: the 13th iteration counts as done
    assert s.position() == {"epoch": 1, "iter": 13, "iter_in_epoch": 3, "val_pending": False, "epoch_offset": 0}
    # then the loop advances the state (loops.run_iter; checked through a run below)
    s = TrainState(max_epochs=3, max_iters=30, by_epoch=True, epoch=1, iter=13, data_epoch=1,
                   batch_in_epoch=3)
    s.finishing("epoch", val_due=True)  # inside after_train_epoch, with a validation due
    assert s.position() == {"epoch": 2, "iter": 13, "iter_in_epoch": 0, "val_pending": True, "epoch_offset": 0}
    s.epoch_done()
    assert (s.epoch, s.data_epoch, s.batch_in_epoch, s.finishing_step) == (2, 2, 0, None)

    restored = TrainState(max_epochs=3, max_iters=30, by_epoch=True)
    restored.restore({"epoch": 2, "iter": 13, "iter_in_epoch": 0, "val_pending": True})
    assert (restored.epoch, restored.iter, restored.val_owed) == (2, 13, True)
    # an iteration-based run: epoch stays 0, the data pass is kept apart
    by_iter = TrainState(max_epochs=1, max_iters=100, by_epoch=False)
    by_iter.restore({"epoch": 4, "iter": 57, "iter_in_epoch": 7})
    assert (by_iter.epoch, by_iter.data_epoch, by_iter.batch_in_epoch) == (0, 4, 7)
    by_iter.next_data_pass()
    assert (by_iter.data_epoch, by_iter.batch_in_epoch) == (5, 0)
    # its one epoch ends training: the data pass stays where it stands (last.pth records it)
    by_iter.batch_in_epoch = 9
    by_iter.finishing("epoch")
    assert by_iter.position()["iter_in_epoch"] == 9
    by_iter.epoch_done()
    assert (by_iter.data_epoch, by_iter.position()["iter_in_epoch"]) == (5, 9)


def test_hooks_read_one_train_state_through_the_runner(tmp_path):
    seen, before = [], []

    class Reader(Hook):
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            state = runner.train_state
            before.append((state.iter, state.batch_in_epoch, state.finishing_step))

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            state = runner.train_state
            seen.append((runner.epoch, runner.iter, runner.by_epoch, state.finishing_step,
                         state.position()["iter"]))

    runner = make_runner(tmp_path, train_cfg=dict(by_epoch=False, max_iters=12, val_interval=6),
                         custom_hooks=[Reader()])
    assert runner.train_state is runner.train_loop.state
    runner.train()
    assert seen[0] == (0, 0, False, "iter", 1) and seen[-1] == (0, 11, False, "iter", 12)
    # after each after_train_iter the iteration is done: the next one is in progress
    assert before[1] == (1, 1, None) and before[-1] == (11, 1, None)
    assert (runner.iter, runner.train_state.finishing_step) == (12, None)
    assert runner.train_state.data_epoch == 1  # 12 iterations over 10 batches: one wrap
    assert make_runner(tmp_path / "eval", train_dataloader=None, train_cfg=None,
                       optim_wrapper=None).train_state.by_epoch is True


# -- sinks -----------------------------------------------------------------------------------------
def _config_file(tmp_path: Path, **overrides) -> Path:
    cfg = base_cfg(tmp_path / "wd", **overrides)
    path = tmp_path / "cfg.py"
    path.write_text("".join(f"{k} = {v!r}\n" for k, v in cfg.items()))
    return path


def test_a_misspelled_sink_is_one_config_line_before_anything_trains(tmp_path, capsys):
    hooks = dict(logger=dict(type="LoggerHook", sinks=["terminal", "jsnol"]))
    expected = ("default_hooks.logger.sinks[1]: unknown sink 'jsnol' (did you mean 'jsonl'?)")
    with pytest.raises(ConfigError) as err:
        make_runner(tmp_path / "direct", default_hooks=hooks)
    assert str(err.value).startswith(expected)
    with pytest.raises(ConfigError) as err:  # what the Ray driver runs before any worker starts
        validate_config(base_cfg(tmp_path / "driver", default_hooks=hooks,
                                 launcher=dict(type="ray", num_workers=2)))
    assert str(err.value).startswith(expected)
    path = _config_file(tmp_path, default_hooks=hooks)
    for argv in (["train", str(path)], ["train", str(path), "--launcher", "ray"],
                 ["hooks", str(path)]):
        assert drun_main(argv) == 2
        err_lines = capsys.readouterr().err.strip().splitlines()
        assert len(err_lines) == 1 and err_lines[0].startswith(f"drun: error: {expected}")
    assert not list((tmp_path / "wd").glob("*.pth"))  # nothing trained
    with pytest.raises(ConfigError, match=r"^default_hooks.logger.sinks\[0\].fodler: JsonlSink "
                                          r"has no argument 'fodler'"):
        make_runner(tmp_path / "arg", default_hooks=dict(logger=dict(
            type="LoggerHook", sinks=[dict(type="jsonl", fodler="x")])))


def test_sinks_are_built_once_by_the_runner_and_served_to_every_hook(tmp_path):
    listed = ListSink()

    class Annotator(Hook):  # any hook writes through runner.sinks, not through LoggerHook
        def after_train(self, runner):
            runner.sinks.write(LogRecord("note", runner.iter, runner.epoch, {"answer": 42.0}))

    runner = make_runner(tmp_path, custom_hooks=[Annotator()], default_hooks=dict(
        logger=dict(type="LoggerHook", interval=5, sinks=["jsonl", listed])))
    built = list(runner.sinks)
    assert isinstance(built[0], JsonlSink) and built[1] is listed
    assert runner.sinks.of_type(JsonlSink) is built[0]
    runner.train()
    assert list(runner.sinks) == built  # the same objects for the whole run
    assert listed.closed and listed.records[-1].mode == "note"
    assert {r.mode for r in listed.records} == {"train", "val", "note"}
    ckpt = torch.load(tmp_path / "epoch_3.pth", weights_only=True)
    assert ckpt["sinks"] == [None, None] and "logger" not in ckpt["hooks"]


# -- declared extension points ---------------------------------------------------------------------
class _DuckGuard(Hook):
    """Has the step-guard methods but does not declare itself a StepGuard: never consulted."""

    def check_loss(self, loss):
        raise AssertionError("called by duck typing")


class _RejectAll(Hook, StepGuard):
    def __init__(self):
        self.rejected = 0

    def check_loss(self, loss):
        return False

    def reject_step(self, runner, loss):
        self.rejected += 1
        return "skip"


def test_step_guards_and_savers_are_declared_not_duck_typed(tmp_path):
    guard = _RejectAll()
    runner = make_runner(tmp_path, custom_hooks=[_DuckGuard(), guard],
                         default_hooks=dict(checkpoint=None))
    assert runner.step_guards == (guard,)
    before = {k: v.detach().clone() for k, v in runner.model.named_parameters()}
    runner.train()
    assert guard.rejected == 30  # every step of 3 epochs x 10 iterations, none taken
    assert all(torch.equal(before[k], v) for k, v in runner.model.named_parameters())

    class Saver(Hook, CheckpointSaver):
        def save_on_request(self, runner, reason):
            self.reason = reason
            return runner.save_checkpoint(runner.work_dir, "requested.pth")

    saver = Saver()
    runner = make_runner(tmp_path / "s", default_hooks=dict(checkpoint=None), custom_hooks=[
        saver, dict(type="RequestHook", kind="checkpoint", at_iter=4)])
    runner.train()
    assert saver.reason == "test checkpoint at 4" and (tmp_path / "s" / "requested.pth").is_file()


def test_after_save_checkpoint_sees_every_written_checkpoint(tmp_path):
    saved = []

    class Indexer(Hook):
        def after_save_checkpoint(self, runner, path, checkpoint):
            saved.append((Path(path).name, Path(path).is_file(), checkpoint["meta"]["iter"]))

    runner = make_runner(tmp_path, custom_hooks=[
        Indexer(), dict(type="RequestHook", kind="checkpoint", at_iter=13)], default_hooks=dict(
        checkpoint=dict(type="CheckpointHook", interval=1, save_best="accuracy")))
    runner.train()
    names = [name for name, _, _ in saved]
    assert all(exists for _, exists, _ in saved)
    assert {"epoch_1.pth", "epoch_2.pth", "epoch_3.pth", "iter_13.pth"} <= set(names)
    assert any(n.startswith("best_accuracy_") for n in names)
    assert ("iter_13.pth", True, 13) in saved and ("epoch_2.pth", True, 20) in saved


def test_drun_hooks_shows_every_extension_point_in_use(tmp_path, capsys):
    path = _config_file(tmp_path, custom_hooks=[dict(type="NonFiniteLossHook", policy="skip")])
    assert drun_main(["hooks", str(path), "--launcher", "ray"]) == 0
    out = capsys.readouterr().out
    assert "ray_report" in out and "RayReportHook" in out
    assert ("after_save_checkpoint  checkpoint (90) -> straggler (90) -> ray_report (100)  "
            "[added to MMEngine's]" in out)
    assert "Extension points:" in out
    assert "step guard             non_finite_loss" in out
    assert "checkpoint on request  checkpoint" in out
    assert "log sinks              logger: jsonl" in out
    assert "rank figures           straggler" in out
    assert drun_main(["hooks", str(path)]) == 0
    assert "ray_report" not in capsys.readouterr().out  # only Ray's workers report to Ray


# -- argument errors name the real config path ---------------------------------------------------
@pytest.mark.parametrize("where, key", [
    ("custom", "custom_hooks[0].save_topk"), ("default", "default_hooks.checkpoint.save_topk")])
def test_hook_argument_errors_name_where_the_hook_is_configured(tmp_path, where, key):
    spec = dict(type="CheckpointHook", save_topk=0)
    cfg = dict(custom_hooks=[spec], default_hooks=dict(checkpoint=None)) if where == "custom" \
        else dict(default_hooks=dict(checkpoint=spec))
    with pytest.raises(ConfigError) as err:
        make_runner(tmp_path, **cfg)
    assert str(err.value) == f"{key}: got 0; takes an int >= 1"


def test_argument_errors_found_later_and_nested_are_placed_too(tmp_path):
    with pytest.raises(ConfigError, match=r"^custom_hooks\[0\]\.interval: cannot read interval"):
        make_runner(tmp_path, custom_hooks=[dict(type="CheckInvalidLossHook", interval="5x")])
    with pytest.raises(ConfigError, match=r"^custom_hooks\[1\]\.momentumm: ExponentialMoving"):
        make_runner(tmp_path, custom_hooks=[dict(type="EMAHook", momentum=0.1),
                                            dict(type="EMAHook", momentumm=0.1)])
    # raised by the hook at its first validation, still named by where it is configured
    runner = make_runner(tmp_path / "late", custom_hooks=[dict(
        type="EarlyStoppingHook", monitor="acc", strict=True)])
    with pytest.raises(ConfigError, match=r"^custom_hooks\[0\]\.monitor: 'acc' is not a "):
        runner.train()


# -- bugs found while reading the core -------------------------------------------------------------
def test_a_model_swapped_in_before_testing_is_the_one_in_eval_mode(tmp_path):
    modes = []

    class ModeProbe(Hook):
        def before_test_iter(self, runner, batch_idx, data_batch=None):
            model = runner.wrapped_model
            modes.append((type(model).__name__, model.training, runner.model.training))

    runner = make_runner(tmp_path, test_dataloader=base_cfg(tmp_path)["val_dataloader"],
                         test_evaluator=dict(type="Accuracy"), test_cfg=dict(),
                         custom_hooks=[dict(type="PrepareTTAHook"), ModeProbe()])
    runner.model.train()
    runner.test()
    assert modes and all(m == ("TTAModel", False, False) for m in modes)
    assert runner.model.training  # given back as it was


def test_a_request_raised_after_the_last_agreement_point_is_acted_on(tmp_path):
    class LateRequest(Hook):
        def after_train_epoch(self, runner):
            if runner.epoch + 1 == runner.max_epochs:
                runner.request_checkpoint("asked at the last after_train_epoch")

    runner = make_runner(tmp_path, custom_hooks=[LateRequest()],
                         default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=-1,
                                                            save_last=False)),
                         train_cfg=dict(by_epoch=True, max_epochs=2), val_dataloader=None,
                         val_evaluator=None, val_cfg=None)
    runner.train()
    assert [e[:2] for e in runner.requests.log] == [(20, "checkpoint")]
    assert (tmp_path / "iter_20.pth").is_file()


# -- import hygiene --------------------------------------------------------------------------------
def test_importing_the_hook_api_loads_neither_the_runner_nor_the_built_in_hooks():
    code = ("import sys, distributed_runner.engine.hook, hooks\n"
            "from hooks import Hook, HOOKS, Priority\n"
            "loaded = [m for m in sys.modules if m.startswith(('hooks.', 'distributed_runner.'))]\n"
            "assert 'distributed_runner.engine.runner' not in loaded, loaded\n"
            "assert not any(m.endswith('_hook') for m in loaded), loaded\n"
            "@HOOKS.register_module()\n"
            "class CheckInvalidLossHook(Hook):\n"
            "    pass\n"
            "assert HOOKS.get('CheckpointHook') is not None  # built-ins load on first look-up\n"
            "assert HOOKS.get('CheckInvalidLossHook') is CheckInvalidLossHook  # the user's stays\n"
            "from hooks import EMAHook; print(EMAHook.__module__)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hooks.ema_hook"


def test_the_docs_show_what_drun_prints(tmp_path, capsys):
    readme = docs_text()
    quoted = readme.split("`drun: error: default_hooks.logger.sinks[0]: unknown sink 'jsnol'")[1]
    quoted = "drun: error: default_hooks.logger.sinks[0]: unknown sink 'jsnol'" + \
        quoted.split("...`")[0]
    path = _config_file(tmp_path, default_hooks=dict(logger=dict(sinks=["jsnol"])))
    assert drun_main(["train", str(path)]) == 2
    assert capsys.readouterr().err.startswith(quoted)
    plan_lines = [line for line in docs_block("hook-plan").splitlines()
                  if line and "..." not in line]
    assert drun_main(["hooks", str(ROOT / "configs" / "digits_cnn.py"), "--launcher", "ray"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(plan_lines) == 5
    for line in plan_lines:
        assert line in printed, line
