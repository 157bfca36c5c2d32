"""EarlyStoppingHook: stop training when a validation metric stops improving."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import Hook
from distributed_runner.evaluation.metric_rules import infer_rule, require_metric

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class EarlyStoppingHook(Hook):
    """After each validation, compare ``monitor`` with the best value so far.

    * ``rule``: ``'greater'``/``'less'``; inferred from the key as CheckpointHook's save_best
      does (:func:`~distributed_runner.evaluation.metric_rules.infer_rule`: ``acc``, ``mAP``...
      greater; ``loss`` less).
    * an improvement is a change beyond ``min_delta``; after ``patience`` validations without one,
      training stops. ``stopping_threshold`` stops as soon as the metric reaches it;
      ``check_finite`` stops when it is NaN or infinite.
    * a ``monitor`` the evaluator does not report is an error before training starts when its
      metrics declare their names (``metric_names()``, as ``Accuracy`` does) — a typo would
      otherwise never stop anything. For metrics that do not, it is found at the first
      validation: ``strict=True`` makes it an error there; otherwise it is warned about once.

    Stopping goes through ``runner.request_stop(reason)``: every rank stops after the same
    validation and the reason is logged. ``best_score`` and ``wait_count`` are in the checkpoint,
    so patience counts across resumes. Ranks: all decide, from metrics identical on every rank.
    """

    priority = "LOWEST"  # MMEngine's: after every other hook has seen the metrics

    def __init__(
        self,
        monitor: str,
        rule: str | None = None,
        min_delta: float = 0.1,
        strict: bool = False,
        check_finite: bool = True,
        patience: int = 5,
        stopping_threshold: float | None = None,
    ) -> None:
        if rule is None:
            rule = infer_rule(monitor)
            if rule is None:
                raise ArgumentError(
                    "rule",
                    f"cannot tell whether a larger {monitor!r} is "
                    f"better: set rule='greater' or rule='less'",
                )
        if rule not in ("greater", "less"):
            raise ArgumentError("rule", f"unknown rule {rule!r}: use 'greater' or 'less'")
        if int(patience) < 1:
            raise ArgumentError("patience", "must be >= 1")
        self.monitor, self.rule = monitor, rule
        self.min_delta = abs(float(min_delta))
        self.strict, self.check_finite = strict, check_finite
        self.patience = int(patience)
        self.stopping_threshold = stopping_threshold
        self.best_score = -math.inf if rule == "greater" else math.inf
        self.wait_count = 0
        self._warned = False

    def _improved(self, value: float) -> bool:
        if self.rule == "greater":
            return value - self.best_score > self.min_delta
        return self.best_score - value > self.min_delta

    def _reached(self, value: float) -> bool:
        if self.stopping_threshold is None:
            return False
        return (
            value >= self.stopping_threshold
            if self.rule == "greater"
            else value <= self.stopping_threshold
        )

    def before_train(self, runner: RunnerAPI) -> None:
        # a monitor the metrics do not report would never stop anything: say so now
        require_metric("monitor", self.monitor, runner.val_metric_names())

    def after_val_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        if runner.train_loop is None or metrics is None:
            return
        if self.monitor not in metrics:
            if self.strict:
                require_metric("monitor", self.monitor, metrics)
            if not self._warned:
                self._warned = True
                runner.logger.warning(
                    "EarlyStoppingHook: %r is not among the validation metrics "
                    "(%s); not stopping early",
                    self.monitor,
                    ", ".join(metrics),
                )
            return
        value = float(metrics[self.monitor])
        if self.check_finite and not math.isfinite(value):
            runner.request_stop(f"early stopping: {self.monitor} is {value}")
            return
        if self._reached(value):
            runner.request_stop(
                f"early stopping: {self.monitor} = {value:.4f} reached "
                f"stopping_threshold {self.stopping_threshold}"
            )
            return
        if self._improved(value):
            self.best_score, self.wait_count = value, 0
            return
        self.wait_count += 1
        if self.wait_count >= self.patience:
            runner.request_stop(
                f"early stopping: {self.monitor} has not improved by more than "
                f"{self.min_delta} for {self.wait_count} validations (best "
                f"{self.best_score:.4f})"
            )

    def state_dict(self) -> dict:
        return {"best_score": self.best_score, "wait_count": self.wait_count}

    def load_state_dict(self, state: dict) -> None:
        self.best_score = float(state.get("best_score", self.best_score))
        self.wait_count = int(state.get("wait_count", 0))
