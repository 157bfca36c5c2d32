"""IterTimerHook: how long each step and its data loading took, and the ETA."""
from __future__ import annotations

import time
from time import perf_counter
from typing import Optional

from distributed_runner.registry import HOOKS

from .hook import DataBatch, Hook


@HOOKS.register_module()
class IterTimerHook(Hook):
    """Record ``<stage>/data_time`` (waiting for the batch) and ``<stage>/time`` (the whole
    iteration, data included) as scalars, and the training ETA in seconds as info ``eta``.

    The ETA divides the time spent since this process started training (not since the run
    started: a resumed run's first steps would otherwise be averaged with another machine's) by the
    iterations done since, times the iterations left. Ranks: all.
    """

    priority = "NORMAL"

    def __init__(self) -> None:
        self._t = 0.0
        self._train_start = 0.0
        self._start_iter = 0
        self._max_iters = 0

    def before_train(self, runner) -> None:
        self._start_iter = runner.iter
        self._max_iters = runner.max_iters
        self._train_start = time.perf_counter()

    def _reset(self, runner) -> None:
        self._t = time.perf_counter()

    before_train_epoch = _reset
    before_val_epoch = _reset
    before_test_epoch = _reset

    def _before_iter(self, runner, stage: str) -> None:
        now = time.perf_counter()
        runner.message_hub.update_scalar(f"{stage}/data_time", now - self._t)

    def _after_iter(self, runner, stage: str) -> float:
        now = time.perf_counter()
        runner.message_hub.update_scalar(f"{stage}/time", now - self._t)
        self._t = now
        return now

    def before_train_iter(self, runner, batch_idx: int, data_batch: DataBatch = None) -> None:
        runner.message_hub.update_scalar("train/data_time", perf_counter() - self._t)

    def after_train_iter(self, runner, batch_idx: int, data_batch: DataBatch = None,
                         outputs: Optional[dict] = None) -> None:
        now = perf_counter()
        hub = runner.message_hub
        hub.update_scalar("train/time", now - self._t)
        self._t = now
        it = runner.iter
        hub.runtime_info["eta"] = ((now - self._train_start) / (it + 1 - self._start_iter)
                                   * (self._max_iters - it - 1))

    def before_val_iter(self, runner, batch_idx: int, data_batch: DataBatch = None) -> None:
        self._before_iter(runner, "val")

    def after_val_iter(self, runner, batch_idx: int, data_batch: DataBatch = None,
                       outputs=None) -> None:
        self._after_iter(runner, "val")

    def before_test_iter(self, runner, batch_idx: int, data_batch: DataBatch = None) -> None:
        self._before_iter(runner, "test")

    def after_test_iter(self, runner, batch_idx: int, data_batch: DataBatch = None,
                        outputs=None) -> None:
        self._after_iter(runner, "test")
