"""AutogradAnomalyDetectHook (iMIX): find the operation that produced a NaN in backward."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class AutogradAnomalyDetectHook(Hook):
    """Turn on ``torch.autograd.set_detect_anomaly`` for training: a backward that produces NaN
    raises with the traceback of the forward operation responsible. It slows every step down
    (several times on small models) — a debugging tool, not a default. The previous setting is
    restored after training. Ranks: every rank.
    """

    priority = "HIGHEST"

    def __init__(self, mode: bool = True, check_nan: bool = True) -> None:
        self.mode = bool(mode)  # iMIX's and torch's name for on/off; False: the hook does nothing
        self.check_nan = bool(check_nan)
        self._previous: tuple[bool, bool] | None = None

    def before_train(self, runner: RunnerAPI) -> None:
        if not self.mode:
            return
        self._previous = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
        torch.autograd.set_detect_anomaly(True, check_nan=self.check_nan)
        runner.logger.warning("autograd anomaly detection is on: training runs slower")

    def after_train(self, runner: RunnerAPI) -> None:
        if self._previous is not None:
            torch.autograd.set_detect_anomaly(self._previous[0], check_nan=self._previous[1])
            self._previous = None
