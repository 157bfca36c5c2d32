"""Test-only hooks that hang a rank, imported on Ray workers (and by ``drun train``) through
``custom_imports=['tests.hang_probe']``: a training thread that hangs inside a hook, a process
that waits to be stopped, and slow phases that must not be called hangs."""
from __future__ import annotations

import os
import time
from pathlib import Path

import tests.ray_probe  # noqa: F401  (ToyLinear, RankDumpHook, SyncBuffersHook's probes)
from distributed_runner.core.registry import HOOKS
from hooks import Hook


def hang_here_forever(marker: Path) -> None:
    """What a hung hook looks like: the test finds this name in the stacks."""
    marker.write_text(f"{time.time()}")
    while True:
        time.sleep(3600)


@HOOKS.register_module(force=True)
class HangOnceHook(Hook):
    """Rank ``rank`` hangs in ``before_train_iter`` of iteration ``at_iter`` — once per work_dir
    (the marker file holds the time it began)."""

    def __init__(self, at_iter: int = -1, rank: int = 1) -> None:
        self.at_iter, self.rank = at_iter, rank

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        marker = Path(runner.work_dir) / "hung_once"
        if runner.iter == self.at_iter and runner.rank == self.rank and not marker.exists():
            hang_here_forever(marker)


def wait_to_be_stopped(marker: Path, settle: float = 1.0) -> None:
    """After ``settle`` seconds (the controller has read this rank's heartbeat in its phase),
    writes ``<pid> <time>`` and waits (at most 60 s) for the test to SIGSTOP this process."""
    time.sleep(settle)
    marker.write_text(f"{os.getpid()} {time.time()}")
    end = time.monotonic() + 60
    while time.monotonic() < end:
        time.sleep(0.02)


@HOOKS.register_module(force=True)
class StopMeOnceHook(Hook):
    """Rank ``rank`` publishes its pid in ``work_dir/stop_me`` at iteration ``at_iter`` (once per
    work_dir) and waits there for the test to send SIGSTOP from outside."""

    def __init__(self, at_iter: int = -1, rank: int = 1) -> None:
        self.at_iter, self.rank = at_iter, rank

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        marker = Path(runner.work_dir) / "stop_me"
        if runner.iter == self.at_iter and runner.rank == self.rank and not marker.exists():
            wait_to_be_stopped(marker)


@HOOKS.register_module(force=True)
class StopAtHook(Hook):
    """Rank ``rank`` waits to be stopped (as :class:`StopMeOnceHook`, once per work_dir and
    ``tag``: its marker is ``work_dir/stop_me_<tag>``), ``settle`` seconds after it got there
    (the controller has read its heartbeat: a read goes out at each health-check poll), at
    iteration ``at_iter`` in ``mount``: ``before_train_iter`` (mid-epoch), ``after_train_iter``
    (before CheckpointHook saves on a checkpoint iteration), ``before_val_iter`` (during a
    validation) or ``after_save_checkpoint`` (saved, before RayReportHook's ``ray.train.report``,
    which the other rank enters). Priority LOW: before CheckpointHook and RayReportHook."""

    priority = "LOW"
    MOUNTS = ("before_train_iter", "after_train_iter", "before_val_iter", "after_save_checkpoint")

    def __init__(self, at_iter: int = -1, rank: int = 1, mount: str = "before_train_iter",
                 tag: str = "", settle: float = 1.0) -> None:
        assert mount in self.MOUNTS, mount
        self.at_iter, self.rank, self.mount, self.settle = at_iter, rank, mount, settle
        self.marker = f"stop_me_{tag}" if tag else "stop_me"

    def _maybe_stop(self, runner, mount: str) -> None:
        marker = Path(runner.work_dir) / self.marker
        if (mount == self.mount and runner.iter == self.at_iter and runner.rank == self.rank
                and not marker.exists()):
            wait_to_be_stopped(marker)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self._maybe_stop(runner, "before_train_iter")

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self._maybe_stop(runner, "after_train_iter")

    def before_val_iter(self, runner, batch_idx, data_batch=None) -> None:
        self._maybe_stop(runner, "before_val_iter")

    def after_save_checkpoint(self, runner, path=None, checkpoint=None) -> None:
        self._maybe_stop(runner, "after_save_checkpoint")


@HOOKS.register_module(force=True)
class SlowPhasesHook(Hook):
    """Slow by nature, each longer than hang_timeout: the first iteration (``first_iter``), every
    checkpoint save (``before_save_checkpoint``) and every validation (``before_val``)."""

    def __init__(self, first_iter: float = 0.0, save: float = 0.0, val: float = 0.0) -> None:
        self.first_iter, self.save, self.val = first_iter, save, val
        self._first = True

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self._first:
            self._first = False
            time.sleep(self.first_iter)

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        time.sleep(self.save)

    def before_val(self, runner) -> None:
        time.sleep(self.val)


@HOOKS.register_module(force=True)
class StartTimesHook(Hook):
    """Rank 0 appends ``<wall time> <iteration>`` to ``work_dir/starts.txt`` whenever a worker
    group starts training: when each attempt began and where it resumed."""

    def before_train(self, runner) -> None:
        if runner.rank == 0:
            with open(Path(runner.work_dir) / "starts.txt", "a") as f:
                f.write(f"{time.time()} {runner.iter}\n")


@HOOKS.register_module(force=True)
class FirstStepTimeHook(Hook):
    """Writes the first training iteration's wall seconds to ``work_dir/first_step_s`` (with
    ``compile=True``: the compilation the first step's allowance is for)."""

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter == 0:
            self._began = time.perf_counter()

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter == 0 and hasattr(self, "_began"):
            seconds = time.perf_counter() - self._began
            (Path(runner.work_dir) / "first_step_s").write_text(f"{seconds}\n")


@HOOKS.register_module(force=True)
class HoldTheGilHook(Hook):
    """At iteration ``at_iter`` calls C's ``sleep`` through ``ctypes.PyDLL``, which keeps the
    GIL for the whole call: no other Python thread of the process runs (the watchdog's neither)."""

    def __init__(self, at_iter: int = 3, seconds: int = 600) -> None:
        self.at_iter, self.seconds = at_iter, seconds

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter == self.at_iter:
            import ctypes

            time.sleep(0.5)  # GIL free: the watchdog sees the step phase and arms for its limit
            (Path(runner.work_dir) / "holding_the_gil").write_text(f"{time.time()}\n")
            hold_the_gil_here(ctypes.PyDLL(None), self.seconds)


def hold_the_gil_here(libc, seconds: int) -> None:
    libc.sleep(seconds)


@HOOKS.register_module(force=True)
class HangWhileBuiltHook(Hook):
    """Rank ``rank`` hangs while the Runner builds its hooks (before ``train()``), once per
    ``marker``: what a dataset stalled on a network file system looks like to the hang watch."""

    def __init__(self, marker: str, rank: int = 1) -> None:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() == rank and not Path(marker).exists():
            hang_here_forever(Path(marker))
