"""ParamSchedulerHook: steps the parameter schedulers at the end of each iteration or epoch."""
from __future__ import annotations

from typing import Optional

from distributed_runner.registry import HOOKS

from .hook import DataBatch, Hook


@HOOKS.register_module()
class ParamSchedulerHook(Hook):
    """Step iteration-based schedulers after every training iteration and epoch-based ones after
    every training epoch. Runs before CheckpointHook (LOW < VERY_LOW) so a saved checkpoint holds
    the learning rate of the step that comes next. Ranks: all (every rank's optimizer).
    """

    priority = "LOW"

    def __init__(self) -> None:
        self._by_iter: list = []
        self._by_epoch: list = []

    def before_train(self, runner) -> None:
        self._by_iter = [s for s in runner.param_schedulers if not s.by_epoch]
        self._by_epoch = [s for s in runner.param_schedulers if s.by_epoch]

    def after_train_iter(self, runner, batch_idx: int, data_batch: DataBatch = None,
                         outputs: Optional[dict] = None) -> None:
        for scheduler in self._by_iter:
            scheduler.step()

    def after_train_epoch(self, runner) -> None:
        for scheduler in self._by_epoch:
            scheduler.step()
