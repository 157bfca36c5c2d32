"""val_cfg=dict(mode='async') without Ray: each due checkpoint is validated by a background
process running the project's own validation loop, while training goes on; results are applied
``lag`` due validations later on every rank, so decisions are deterministic and resume exactly.

Real processes, real files: the validation process is ``python -m
distributed_runner.launch.validation_worker``; every comparison is against an in-loop run of the same
config (the toy evaluator is deterministic)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from distributed_runner import Runner
from distributed_runner.core.errors import ConfigError
from tests.toy import assert_state_equal, base_cfg, free_port, gloo_rank, params_of

pytestmark = pytest.mark.timeout(240)

# a validation curve that goes up and down: 81.7 88.3 90.0 86.7 95.0 93.3 88.3 93.3 (best: epoch 5)
VAL = dict(dataset=dict(type="ToyDataset", n=60, seed=1), batch_size=8,
           sampler=dict(type="DefaultSampler", shuffle=False))


def cfg(work_dir: Path, mode: str, checkpoint: dict, *hooks: dict, lag: int = 1) -> dict:
    return base_cfg(
        work_dir,
        custom_imports=dict(imports=["tests.toy", "tests.async_val_probes"]),
        val_dataloader=VAL,
        val_cfg=dict(mode=mode, lag=lag) if mode == "async" else dict(),
        train_cfg=dict(by_epoch=True, max_epochs=8, val_interval=1),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        default_hooks=dict(logger=dict(type="LoggerHook", interval=5, sinks=["jsonl"]),
                           checkpoint=dict(type="CheckpointHook", **checkpoint)),
        custom_hooks=list(hooks),
    )


def train(config: dict) -> Runner:
    runner = Runner.from_cfg(config)
    runner.train()
    return runner


def val_records(work_dir: Path) -> dict[int, tuple[int, float]]:
    """step -> (epoch, accuracy) of the run's validation records; a step logged twice (by a
    killed run and by its resumption) must carry the same values."""
    out: dict[int, tuple[int, float]] = {}
    for line in (work_dir / "logs" / "scalars.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["mode"] == "val":
            value = (rec["epoch"], rec["accuracy"])
            assert out.setdefault(rec["step"], value) == value, rec
    return out


def stop_iter(runner: Runner) -> int:
    return next(i for i, kind, _ in runner.requests.log if kind == "stop")


@pytest.mark.slow("runs beside a validation process, inline and async")
def test_async_logs_and_picks_best_as_inline(tmp_path):
    """Same metrics at the same steps, the same best checkpoint (the validated file itself,
    linked: same bytes), the same weights."""
    keep = dict(interval=1, save_best="accuracy", max_keep_ckpts=4)
    inline = train(cfg(tmp_path / "inline", "inline", keep))
    async_cfg = cfg(tmp_path / "async", "async", keep)
    async_cfg["default_hooks"]["logger"]["sinks"] = ["jsonl", "mlflow"]  # sqlite in work_dir
    run = train(async_cfg)
    expected = val_records(tmp_path / "inline")
    assert [s for s in expected] == [10 * e for e in range(1, 9)]
    assert val_records(tmp_path / "async") == expected
    # the same values in the run's MLflow run, charted at the validated epochs
    from mlflow.tracking import MlflowClient

    run_id = json.loads((tmp_path / "async" / "mlflow_run.json").read_text())["run_id"]
    history = MlflowClient(f"sqlite:///{tmp_path / 'async' / 'mlflow.db'}").get_metric_history(
        run_id, "val/accuracy")
    assert sorted((m.step, m.value) for m in history) == [e for e in expected.values()]
    best = run.get_hook("checkpoint").best_files
    assert best == inline.get_hook("checkpoint").best_files == {"accuracy":
                                                              "best_accuracy_epoch_5.pth"}
    linked = tmp_path / "async" / "best_accuracy_epoch_5.pth"
    assert linked.read_bytes() == (tmp_path / "async" / "epoch_5.pth").read_bytes()
    assert_state_equal(torch.load(linked, weights_only=True)["state_dict"],
                       torch.load(tmp_path / "inline" / "best_accuracy_epoch_5.pth",
                                  weights_only=True)["state_dict"])
    assert_state_equal(params_of(run.model), params_of(inline.model))


@pytest.mark.slow("runs beside a validation process, stopped and resumed")
def test_async_early_stopping_lag_and_exact_resume(tmp_path):
    """EarlyStopping stops ``lag`` validations after the in-loop run; a run killed twice (right
    after a periodic checkpoint, and right after a due point's own checkpoint) and resumed takes
    the same decisions, logs the same metrics and ends with the same weights; with
    max_keep_ckpts=1 no checkpoint is removed before its validation ran."""
    ckpt = dict(interval=2, save_best="accuracy", max_keep_ckpts=1)
    stop = dict(type="EarlyStoppingHook", monitor="accuracy", patience=1, min_delta=0.5)
    inline = train(cfg(tmp_path / "inline", "inline", ckpt, stop))
    whole = train(cfg(tmp_path / "whole", "async", ckpt, stop))
    assert stop_iter(inline) == 40
    assert stop_iter(whole) == stop_iter(inline) + 1 * 10  # lag 1 x val_interval 1 x 10 iters
    common = val_records(tmp_path / "inline")
    assert {s: v for s, v in val_records(tmp_path / "whole").items() if s in common} == common
    assert max(val_records(tmp_path / "whole")) == 50  # the last due point's, applied at the end

    killed = cfg(tmp_path / "killed", "async", ckpt, stop, dict(type="DieAtHook", iters=(25, 35)))
    for _ in range(2):
        with pytest.raises(RuntimeError, match="DieAtHook"):
            train({**killed, "resume": True})
    resumed = train({**killed, "resume": True})
    assert stop_iter(resumed) == stop_iter(whole)
    assert val_records(tmp_path / "killed") == val_records(tmp_path / "whole")
    assert resumed.get_hook("checkpoint").state_dict() == whole.get_hook("checkpoint").state_dict()
    assert resumed.get_hook("early_stopping").state_dict() == \
        whole.get_hook("early_stopping").state_dict()
    assert_state_equal(params_of(resumed.model), params_of(whole.model))
    for run in ("whole", "killed"):  # what max_keep_ckpts=1 pinned is gone once validated
        assert sorted(p.name for p in (tmp_path / run).glob("*.pth")) == \
            ["best_accuracy_epoch_5.pth", "iter_50.pth"]


def _two_ranks(rank: int, port: int, out: str) -> None:
    with gloo_rank(rank, port):
        ckpt = dict(interval=1, save_best="accuracy", max_keep_ckpts=1)
        stop = dict(type="EarlyStoppingHook", monitor="accuracy", patience=1, min_delta=0.5)
        sync = dict(type="SyncBuffersHook")  # one set of BatchNorm statistics, checkpointed
        for mode in ("inline", "async"):
            runner = train(cfg(Path(out) / mode, mode, ckpt, stop, sync))
            torch.save({"params": params_of(runner.model), "stop": stop_iter(runner),
                        "early": runner.get_hook("early_stopping").state_dict(),
                        "best": runner.get_hook("checkpoint").best_files},
                       f"{out}/{mode}_rank{rank}.pt")


@pytest.mark.slow("2 gloo processes beside a validation process")
def test_two_ranks_apply_the_same_results_at_the_same_iteration(tmp_path):
    """DDP over 2 gloo ranks (5 iterations an epoch, SyncBuffersHook): rank 0 hands the
    checkpoints over and sends the results; both ranks stop at the same iteration, lag
    validations after in-loop, with the same weights and decisions, and the logged metrics are
    in-loop's."""
    mp.spawn(_two_ranks, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    got = {(m, r): torch.load(tmp_path / f"{m}_rank{r}.pt", weights_only=False)
           for m in ("inline", "async") for r in (0, 1)}
    for mode in ("inline", "async"):
        assert_state_equal(got[mode, 0]["params"], got[mode, 1]["params"])
        assert got[mode, 0]["stop"] == got[mode, 1]["stop"]
        assert got[mode, 0]["early"] == got[mode, 1]["early"]
    assert got["async", 0]["stop"] == got["inline", 0]["stop"] + 5
    common = val_records(tmp_path / "inline")
    assert {s: v for s, v in val_records(tmp_path / "async").items() if s in common} == common


def test_the_terminal_line_marks_an_asynchronous_result():
    from distributed_runner.tracking.sinks import LogRecord
    from distributed_runner.tracking.sinks.terminal import format_record

    record = LogRecord("val", 30, 3, {"accuracy": 90.0}, {"by_epoch": True,
                                                         "async_applied_iter": 40})
    assert format_record(record) == "Epoch(val) [3] (async, applied at iter 40)  accuracy: 90.0000"


def test_val_cfg_mode_is_checked(tmp_path):
    with pytest.raises(ConfigError, match=r"val_cfg.mode.*'asnyc'.*did you mean 'async'"):
        Runner.from_cfg(base_cfg(tmp_path, val_cfg=dict(mode="asnyc")))
