"""EmptyCacheHook: give cached, unused GPU memory back to the driver at chosen moments."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import DataBatch, Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class EmptyCacheHook(Hook):
    """``torch.cuda.empty_cache()`` before each epoch (``before_epoch``), after each iteration
    (``after_iter``) and/or after each epoch (``after_epoch``, the default) — of training,
    validation and testing. Useful when another process shares the GPU or memory fragments across
    phases; it costs speed, so ``after_iter`` is off by default. A no-op without CUDA.
    Ranks: every rank, on its own device.
    """

    priority = "NORMAL"

    def __init__(
        self, before_epoch: bool = False, after_epoch: bool = True, after_iter: bool = False
    ) -> None:
        self.on_before_epoch, self.on_after_epoch = bool(before_epoch), bool(after_epoch)
        self.on_after_iter = bool(after_iter)
        self.emptied = 0  # how many times the cache was emptied (or would have been, on CPU)

    def _empty(self) -> None:
        self.emptied += 1
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    # MMEngine's helpers: the base class forwards every train/val/test epoch and iteration to them
    def _before_epoch(self, runner: RunnerAPI, mode: str = "train") -> None:
        if self.on_before_epoch:
            self._empty()

    def _after_epoch(self, runner: RunnerAPI, mode: str = "train") -> None:
        if self.on_after_epoch:
            self._empty()

    def _after_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: Any = None,
        mode: str = "train",
    ) -> None:
        if self.on_after_iter:
            self._empty()
