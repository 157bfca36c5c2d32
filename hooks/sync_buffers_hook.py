"""SyncBuffersHook: one set of BatchNorm statistics for all ranks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from distributed_runner.core import dist
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class SyncBuffersHook(Hook):
    """Average the model's floating-point buffers (BN ``running_mean``/``running_var``) across
    ranks at the end of every training epoch — and, in iteration-based training, before each
    validation — so that evaluation and checkpoints see the same statistics on every rank.
    Integer buffers (``num_batches_tracked``) are equal on all ranks already and are left alone.
    Ranks: all (one all-reduce per buffer); a no-op in a single process.
    """

    priority = "NORMAL"

    def _sync(self, runner: RunnerAPI) -> None:
        if not dist.is_distributed():
            return
        for buf in runner.model.buffers():
            if torch.is_floating_point(buf):
                dist.all_reduce(buf, "mean")

    def after_train_epoch(self, runner: RunnerAPI) -> None:
        self._sync(runner)

    def before_val(self, runner: RunnerAPI) -> None:
        if runner.train_loop is not None and not runner.by_epoch:
            self._sync(runner)
