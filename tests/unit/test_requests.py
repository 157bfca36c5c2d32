"""Requests with rank consensus, the interval spec, time-based and top-K checkpoints, the
NaN/inf policy and SIGTERM preemption — in-process and over 2 local gloo processes."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

import distributed_runner.core.interval as interval_module
import tests.hook_probes
from distributed_runner import Runner
from distributed_runner.checkpoint.files import read_pointer
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.interval import Interval
from distributed_runner.core.preemption import TrainingPreempted
from tests.toy import (
    assert_state_equal,
    base_cfg,
    free_port,
    gloo_rank,
    make_runner,
    params_of,
)

REPO = Path(__file__).resolve().parents[2]


# -- requests ------------------------------------------------------------------------------------
def test_stop_request_ends_training_after_that_iteration_with_its_reason(tmp_path):
    runner = make_runner(tmp_path, custom_hooks=[dict(type="RequestHook", kind="stop", at_iter=7)])
    runner.train()
    assert runner.iter == 7
    assert runner.requests.log == [(7, "stop", ("test stop at 7",))]
    kept = torch.load(read_pointer(tmp_path), weights_only=True)
    assert kept["meta"]["iter"] == 7  # stopped = finished: the final state is kept


def test_checkpoint_request_saves_a_resumable_checkpoint_mid_epoch(tmp_path):
    full = make_runner(tmp_path / "full")
    full.train()
    runner = make_runner(tmp_path / "a", custom_hooks=[
        dict(type="RequestHook", kind="checkpoint", at_iter=14)])
    runner.train()
    path = tmp_path / "a" / "iter_14.pth"
    assert path.is_file() and runner.requests.log[0][:2] == (14, "checkpoint")
    ckpt = torch.load(path, weights_only=True)
    assert (ckpt["meta"]["iter"], ckpt["meta"]["iter_in_epoch"]) == (14, 4)
    resumed = make_runner(tmp_path / "b", resume=str(path))
    resumed.train()
    assert_state_equal(params_of(resumed.model), params_of(full.model))


def test_val_request_runs_validation_then_training_goes_on(tmp_path):
    runner = make_runner(tmp_path, custom_hooks=[dict(type="RequestHook", kind="val", at_iter=4)])
    runner.train()
    assert len(runner.message_hub.get_scalar("val/accuracy").values()) == 4  # 3 epochs + 1
    assert runner.iter == 30


def test_unknown_request_kind_is_refused():
    from distributed_runner.engine.requests import ControlRequests
    with pytest.raises(ValueError, match="unknown request 'pause'"):
        ControlRequests().request("pause", "x")


# -- interval spec -------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, by_epoch, kind, every", [
    (5, True, "epoch", 5), (5, False, "iter", 5), (0, True, "never", 0), (-1, False, "never", 0),
    ("500it", True, "iter", 500), ("2ep", False, "epoch", 2), ("90s", True, "time", 90.0),
    ("30min", True, "time", 1800.0), ("1h", False, "time", 3600.0), ("1.5h", True, "time", 5400.0),
    (" 3 epochs ", True, "epoch", 3)])
def test_interval_spec(spec, by_epoch, kind, every):
    parsed = Interval.parse(spec, by_epoch, "k")
    assert (parsed.kind, parsed.every) == (kind, every)


@pytest.mark.parametrize("spec", ["5 parsecs", "it", "1.5it", "0min", True, 2.5, None])
def test_bad_interval_specs_are_one_line_errors(spec):
    with pytest.raises(ConfigError, match=r"^k: "):
        Interval.parse(spec, True, "k")


def test_wall_time_interval_fires_when_the_clock_says(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(interval_module, "_clock", lambda: now[0])
    every = Interval.parse("30min", True, "k")
    every.start_clock()
    now[0] += 1799
    assert not every.time_due()
    now[0] += 2
    assert every.time_due() and not every.time_due()


def test_checkpoint_hook_saves_by_wall_time(tmp_path, monkeypatch):
    clock = [0.0]

    def tick():  # every call advances 4 minutes: the hook checks once per iteration
        clock[0] += 240
        return clock[0]
    monkeypatch.setattr(interval_module, "_clock", tick)
    runner = make_runner(tmp_path, default_hooks=dict(
        checkpoint=dict(type="CheckpointHook", interval="30min", save_last=False)))
    runner.train()
    saved = sorted(p.name for p in tmp_path.glob("iter_*.pth"))
    # start_clock + 8 checks of 4 min = 32 min > 30 min: every 8th iteration
    assert saved == ["iter_16.pth", "iter_24.pth", "iter_8.pth"]


def test_logger_and_checkpoint_accept_iteration_and_epoch_strings(tmp_path):
    from tests.toy import ListSink
    sink = ListSink()
    runner = make_runner(tmp_path, default_hooks=dict(
        logger=dict(type="LoggerHook", interval="2ep", sinks=[sink]),
        checkpoint=dict(type="CheckpointHook", interval="15it")))
    runner.train()
    assert [r.step for r in sink.records if r.mode == "train"] == [20]
    assert sorted(p.name for p in tmp_path.glob("iter_*.pth")) == ["iter_15.pth", "iter_30.pth"]


def test_save_topk_keeps_the_k_best(tmp_path):
    runner = make_runner(
        tmp_path, train_cfg=dict(by_epoch=True, max_epochs=5),
        val_evaluator=dict(type="SeqMetric", values=[0.5, 0.9, 0.7, 0.8, 0.6]),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=-1, save_best="score",
                                           rule="greater", save_topk=2)))
    runner.train()
    best = sorted(p.name for p in tmp_path.glob("best_*.pth"))
    assert best == ["best_score_epoch_2.pth", "best_score_epoch_4.pth"]
    hook = runner.get_hook("checkpoint")
    assert hook.best_scores == {"score": 0.9} and hook.best_files["score"] == "best_score_epoch_2.pth"
    assert [p.name for p in hook.saved_files()["best"]] == ["best_score_epoch_2.pth",
                                                             "best_score_epoch_4.pth"]
    with pytest.raises(ConfigError, match="save_topk: got 0; takes an int >= 1"):
        make_runner(tmp_path, default_hooks=dict(checkpoint=dict(type="CheckpointHook",
                                                                 save_topk=0)))


# -- NaN / inf policy ----------------------------------------------------------------------------
def _nan_runner(path, policy, nan_at, **hook_args):
    return make_runner(path, model=dict(type="NanModel", nan_at=nan_at),
                       custom_hooks=[dict(type="NonFiniteLossHook", policy=policy, **hook_args)])


def test_nan_policy_raise(tmp_path):
    runner = _nan_runner(tmp_path, "raise", [5])
    with pytest.raises(FloatingPointError, match="non-finite loss at iteration 5"):
        runner.train()


def test_nan_policy_skip_drops_exactly_that_step(tmp_path):
    runner = _nan_runner(tmp_path, "skip", [5, 17])
    weights = {}

    class Watch(tests.hook_probes.Hook):
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            weights[runner.iter] = params_of(runner.model)

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            weights[("after", runner.iter)] = (params_of(runner.model), outputs)

    runner._hooks.register(Watch(), "watch")
    runner.train()
    assert runner.iter == 30
    after4, outputs = weights[("after", 4)]
    assert outputs["skipped_steps"] == 1.0
    for k, v in weights[4].items():  # iteration 5 changed nothing (BN stats aside)
        if "running" not in k and "num_batches" not in k:
            assert torch.equal(v, after4[k]), k
    assert runner.get_hook("non_finite_loss").events == 2


def test_nan_policy_rollback_restores_and_scales_the_lr(tmp_path):
    runner = make_runner(tmp_path, model=dict(type="NanModel", nan_at=[15]),
                         default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1)),
                         custom_hooks=[dict(type="NonFiniteLossHook", policy="rollback",
                                            lr_scale=0.5)])
    runner.train()
    hook = runner.get_hook("non_finite_loss")
    assert (hook.events, hook.lr_factor) == (1, 0.5)
    assert runner.iter == 30 and runner.model.forwards == 35  # iterations 11-15 ran twice
    assert runner.optim_wrapper.get_lr()[0] == pytest.approx(0.05)
    state = torch.load(tmp_path / "epoch_3.pth", weights_only=True)["hooks"]["non_finite_loss"]
    assert state == {"events": 1, "lr_factor": 0.5}


def test_nan_policy_gives_up_after_max_events_and_rollback_needs_a_checkpoint(tmp_path):
    with pytest.raises(FloatingPointError, match="after 2 events"):
        _nan_runner(tmp_path / "a", "skip", [2, 4, 6], max_events=2).train()
    with pytest.raises(FloatingPointError, match="no checkpoint saved yet"):
        _nan_runner(tmp_path / "b", "rollback", [3]).train()
    with pytest.raises(ConfigError, match="policy: unknown policy 'ignore'"):
        _nan_runner(tmp_path / "c", "ignore", [])


# -- preemption ----------------------------------------------------------------------------------
def test_sigterm_checkpoints_exits_and_resume_matches_the_uninterrupted_run(tmp_path):
    full = make_runner(tmp_path / "full")
    full.train()
    runner = make_runner(tmp_path / "run", custom_hooks=[dict(type="SignalHook", at_iter=13)])
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingPreempted, match="SIGTERM") as info:
        runner.train()
    assert signal.getsignal(signal.SIGTERM) is before  # handler restored
    assert Path(info.value.checkpoint).name == "iter_13.pth" and runner.iter == 13
    assert not (tmp_path / "run" / "last.pth").exists()  # preempted is not finished
    resumed = make_runner(tmp_path / "run", resume=True,
                          custom_hooks=[dict(type="SignalHook", at_iter=13)])
    resumed.train()
    assert_state_equal(params_of(resumed.model), params_of(full.model))


def test_preemption_config_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="preemption.signals: unknown signal 'SIGFOO'"):
        make_runner(tmp_path, preemption=dict(signals=["SIGFOO"]))
    with pytest.raises(ConfigError, match="preemption.grace: unknown key"):
        make_runner(tmp_path, preemption=dict(grace=3))
    runner = make_runner(tmp_path, preemption=False,
                         custom_hooks=[dict(type="RequestHook", kind="stop", at_iter=2)])
    runner.train()  # no handler installed, nothing else changes
    assert runner.iter == 2


@pytest.mark.slow("a drun subprocess stopped by SIGTERM, then resumed")
def test_drun_train_on_sigterm_exits_143_within_the_bound_then_resumes_exactly(tmp_path):
    cfg = base_cfg(tmp_path / "wd", custom_imports=["tests.hook_probes"],
                   custom_hooks=[dict(type="SleepHook", seconds=0.05)],
                   preemption=dict(grace_period=20))
    cfg["default_hooks"]["logger"]["sinks"] = ["jsonl"]
    (tmp_path / "cfg.py").write_text("\n".join(f"{k} = {v!r}" for k, v in cfg.items()))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}  # as in this process
    command = [sys.executable, "-m", "distributed_runner.cli", "train", str(tmp_path / "cfg.py")]
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "wd" / "epoch_1.pth").is_file():
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err[-2000:]
    assert time.monotonic() - sent < 20
    assert "preempted (SIGTERM)" in err and "--resume" in err
    pointer = str(read_pointer(tmp_path / "wd"))
    stopped_at = torch.load(pointer, weights_only=True)["meta"]["iter"]
    assert 10 <= stopped_at < 30
    done = subprocess.run(command + ["--resume"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    full = make_runner(tmp_path / "full")
    full.train()
    final = torch.load(read_pointer(tmp_path / "wd"), weights_only=True)
    assert final["meta"]["iter"] == 30
    assert_state_equal(final["state_dict"], params_of(full.model))


# -- two ranks: a request or a NaN on one rank only ----------------------------------------------
def _each_body(rank: int, port: int, out_dir: str) -> None:
    """Every two-rank body below, one after the other, in one process group: one spawn of 2
    processes for the four tests (issue 47: a spawn's start and imports cost more than a body).
    A rank whose body fails exits at once (tests.toy.gloo_rank), so the other is not left
    waiting in the next body's collective."""
    with gloo_rank(rank, port):
        for body in TWO_RANK_BODIES:
            folder = os.path.join(out_dir, body.__name__)
            os.makedirs(folder, exist_ok=True)
            body(rank, folder)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """The folder where each body left its files, under the body's name."""
    folder = tmp_path_factory.mktemp("two_ranks")
    mp.spawn(_each_body, args=(free_port(), str(folder)), nprocs=2, join=True)
    return folder


def _two_rank_body(rank: int, out_dir: str) -> None:
    runner = Runner.from_cfg(base_cfg(
        os.path.join(out_dir, "wd"), model=dict(type="NanModel", nan_at=[3], nan_rank=1),
        train_cfg=dict(by_epoch=True, max_epochs=6),
        val_evaluator=dict(type="SeqMetric", values=[0.5, 0.6, 0.6, 0.6, 0.6, 0.6]),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=-1)),
        custom_hooks=[dict(type="NonFiniteLossHook", policy="skip"),
                      dict(type="RequestHook", kind="checkpoint", at_iter=4, rank=1),
                      dict(type="RequestHook", kind="val", at_iter=7, rank=0),
                      dict(type="EarlyStoppingHook", monitor="score", rule="greater",
                           patience=2,
                           min_delta=0.01)]))
    runner.train()
    result = {"iter": runner.iter, "log": [list(e[:2]) for e in runner.requests.log],
              "reasons": [list(e[2]) for e in runner.requests.log],
              "events": runner.get_hook("non_finite_loss").events,
              "weights": {k: v.tolist() for k, v in runner.model.state_dict().items()
                          if "weight" in k}}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def test_requests_and_nan_skip_raised_on_one_rank_are_agreed_by_both(two_ranks):
    tmp_path = two_ranks / "_two_rank_body"
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    # 20 samples / 2 ranks / batch 4 = 5 iterations per epoch; scores 0.5, 0.6 (+val request),
    # then no improvement twice -> early stop after the 4th validation (epoch 3)
    assert r0["iter"] == r1["iter"] == 15
    # agree_every='auto' agrees after every iteration while it times the first 20
    assert r0["log"] == r1["log"] == [[4, "checkpoint"], [7, "val"], [15, "stop"]]
    assert r0["reasons"][0] == ["test checkpoint at 4 (rank 1)"]
    assert r0["reasons"][1] == ["test val at 7 (rank 0)"]
    assert "early stopping: score has not improved" in r0["reasons"][2][0]
    assert r0["events"] == r1["events"] == 1  # rank 1's NaN made both skip
    assert r0["weights"] == r1["weights"]  # the step was skipped on both: still in sync
    assert (tmp_path / "wd" / "iter_4.pth").is_file()


def _rollback_body(rank: int, out_dir: str) -> None:
    runner = Runner.from_cfg(base_cfg(
        os.path.join(out_dir, "wd"), model=dict(type="NanModel", nan_at=[8], nan_rank=1),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1)),
        custom_hooks=[dict(type="NonFiniteLossHook", policy="rollback", lr_scale=0.5),
                      dict(type="ControlDumpHook")]))
    runner.train()
    with open(os.path.join(out_dir, f"forwards{rank}.json"), "w") as f:
        json.dump(runner.model.forwards, f)


def test_rollback_on_one_rank_restores_both_from_rank_0s_checkpoint(two_ranks):
    tmp_path = two_ranks / "_rollback_body"
    r0, r1 = (json.loads((tmp_path / "wd" / f"control_rank{r}.json").read_text()) for r in (0, 1))
    assert r0["events"] == r1["events"] == 1
    assert r0["lr"] == r1["lr"] == pytest.approx(0.05)
    assert r0["weights"] == r1["weights"] and r0["iter"] == r1["iter"] == 15
    # 5 iterations an epoch: NaN at the 8th forward -> back to epoch_1 (iter 5), 3 redone
    assert [json.loads((tmp_path / f"forwards{r}.json").read_text()) for r in (0, 1)] == [18, 18]


def _auto_body(rank: int, out_dir: str) -> None:
    runner = Runner.from_cfg(base_cfg(
        os.path.join(out_dir, "wd"), train_cfg=dict(by_epoch=True, max_epochs=8),
        default_hooks=dict(checkpoint=None),
        custom_hooks=[dict(type="RequestHook", kind="stop_training", at_iter=27, rank=1),
                      dict(type="RequestHook", kind="stop", at_iter=29, rank=0)]))
    runner.train()
    with open(os.path.join(out_dir, f"auto{rank}.json"), "w") as f:
        json.dump({"iter": runner.iter, "n": runner.requests.agree_n,
                   "log": [list(e[:2]) for e in runner.requests.log],
                   "reasons": [list(e[2]) for e in runner.requests.log]}, f)


def test_auto_agreement_interval_is_the_same_on_every_rank(two_ranks):
    """Also MMEngine's flag set on one rank (issue 48): rank 1's hook sets
    ``train_loop.stop_training = True`` after iteration 27 and both ranks stop at the same
    agreement point (MMEngine's loop would end rank 1 alone, and rank 0 would die in its next
    collective); rank 0's request_stop after 29 lands with it when the interval reaches 30."""
    tmp_path = two_ranks / "_auto_body"
    r0, r1 = (json.loads((tmp_path / f"auto{r}.json").read_text()) for r in (0, 1))
    assert r0["n"] == r1["n"] >= 1  # rank 0 timed 20 iterations and sent its choice along
    assert r0["iter"] == r1["iter"] and r0["log"] == r1["log"] and len(r0["log"]) == 1
    stop = r0["log"][0][0]
    # acted after iteration 27 at the next agreement: a multiple of n or the epoch end (30)
    assert stop == 27 + (-27 % r0["n"]) or stop == 30
    assert r0["iter"] == stop
    assert "train_loop.stop_training = True (rank 1)" in r0["reasons"][0]


@pytest.mark.parametrize("by_epoch", [True, False])
def test_mmengines_stop_training_flag_ends_training_after_that_iteration(tmp_path, by_epoch):
    train_cfg = (dict(by_epoch=True, max_epochs=3) if by_epoch
                 else dict(type="IterBasedTrainLoop", max_iters=30, val_interval=10))
    runner = make_runner(tmp_path, train_cfg=train_cfg, custom_hooks=[
        dict(type="RequestHook", kind="stop_training", at_iter=7)])
    runner.train()
    assert runner.iter == 7 and runner.train_loop.stop_training
    assert runner.requests.log == [(7, "stop", ("train_loop.stop_training = True",))]
    assert torch.load(read_pointer(tmp_path), weights_only=True)["meta"]["iter"] == 7


def _late_body(rank: int, out_dir: str) -> None:
    runner = Runner.from_cfg(base_cfg(
        os.path.join(out_dir, "wd"), default_hooks=dict(checkpoint=dict(
            type="CheckpointHook", interval=-1, save_last=False)),
        train_cfg=dict(by_epoch=True, max_epochs=2, agree_every=4), val_dataloader=None,
        val_evaluator=None, val_cfg=None,
        custom_hooks=[dict(type="RequestHook", kind="checkpoint", at_iter=9, rank=1)]))
    runner.train()
    with open(os.path.join(out_dir, f"late{rank}.json"), "w") as f:
        json.dump([list(e[:2]) for e in runner.requests.log], f)


def test_a_request_after_the_last_agreement_point_is_agreed_on_at_the_end(two_ranks):
    # 5 iterations an epoch, 10 in all; ranks agree after 4 and 8: the request after 9 is left
    tmp_path = two_ranks / "_late_body"
    logs = [json.loads((tmp_path / f"late{r}.json").read_text()) for r in (0, 1)]
    assert logs == [[[10, "checkpoint"]]] * 2
    assert (tmp_path / "wd" / "iter_10.pth").is_file()


def test_agree_every_is_checked(tmp_path):
    with pytest.raises(ConfigError, match="train_cfg.agree_every: got 0; takes an int >= 1 or 'auto'"):
        make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=1, agree_every=0))


TWO_RANK_BODIES = (_two_rank_body, _rollback_body, _auto_body, _late_body)
