"""CheckInvalidLossHook: the seeds' example, shipped — fail fast when the loss is inf or NaN."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from distributed_runner.core import dist
from distributed_runner.core.interval import Interval
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import DataBatch, Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class CheckInvalidLossHook(Hook):
    """Every ``interval`` iterations (``50``, ``'50it'`` or a wall time like ``'10min'``) check
    ``outputs['loss']``; if it is infinite or NaN on any rank, every rank raises
    ``FloatingPointError`` naming the iteration (the ranks agree first — one all-reduce at each
    check when distributed — so none waits on a collective the others left).
    To skip or roll back such steps instead, use NonFiniteLossHook.
    Ranks: all check; all raise together.
    """

    priority = "NORMAL"

    def __init__(self, interval: int | str = 50) -> None:
        self.every = Interval.parse(interval, by_epoch=False, key="interval")

    def before_train(self, runner: RunnerAPI) -> None:
        self.every.start_clock()

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
    ) -> None:
        if not self.every.due_after_iter(runner):
            return
        loss = (outputs or {}).get("loss")
        finite = loss is None or bool(torch.isfinite(torch.as_tensor(loss)).all())
        if dist.is_distributed():
            finite = bool(dist.all_reduce(torch.tensor([int(finite)]), "min").item())
        if not finite:
            raise FloatingPointError(
                f"loss became infinite or NaN at iteration {runner.iter + 1}"
                f" (on rank {runner.rank}: {loss}); lower the learning rate, "
                f"clip gradients (optim_wrapper.clip_grad) or add "
                f"NonFiniteLossHook(policy='skip')"
            )
