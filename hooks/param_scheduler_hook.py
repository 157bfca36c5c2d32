"""ParamSchedulerHook: steps the parameter schedulers at the end of each iteration or epoch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import DataBatch, Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class ParamSchedulerHook(Hook):
    """Step iteration-based schedulers after every training iteration and epoch-based ones after
    every training epoch. Runs before CheckpointHook (LOW < VERY_LOW) so a saved checkpoint holds
    the learning rate of the step that comes next. Ranks: all (every rank's optimizer).

    As MMEngine's, it reads ``runner.param_schedulers`` when it steps them (a list, or a dict of
    lists for several optimizers; None: nothing to step) and keeps no state of its own, so a
    subclass that overrides ``__init__``/``before_train`` without calling them (mmyolo's
    YOLOv5ParamSchedulerHook) still steps whatever schedulers the config has.
    """

    priority = "LOW"

    @staticmethod
    def _schedulers(runner: RunnerAPI) -> list:
        schedulers = runner.param_schedulers
        if isinstance(schedulers, dict):
            return [s for group in schedulers.values() for s in group]
        return schedulers or []

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
    ) -> None:
        if not runner.param_schedulers:  # none configured: every iteration, so the cheap test
            return
        for scheduler in self._schedulers(runner):
            if not scheduler.by_epoch:
                scheduler.step()

    def after_train_epoch(self, runner: RunnerAPI) -> None:
        for scheduler in self._schedulers(runner):
            if scheduler.by_epoch:
                scheduler.step()
