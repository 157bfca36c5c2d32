"""RuntimeInfoHook: publishes counters, learning rates, losses and metrics to the MessageHub."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distributed_runner.registry import HOOKS

from .hook import DataBatch, Hook

if TYPE_CHECKING:
    from distributed_runner.runner_api import RunnerAPI


@HOOKS.register_module()
class RuntimeInfoHook(Hook):
    """Keep the MessageHub current so modules without the runner can read the run's state.

    Runtime info: ``epoch``, ``iter``, ``max_epochs``, ``max_iters``. Scalars: ``train/lr`` (first
    param group; ``train/lr_groupN`` for others), every entry of the train step's outputs as
    ``train/<key>``, validation/test metrics as ``val/<key>`` / ``test/<key>``.
    Ranks: all (each rank keeps its own hub; loggers average across ranks when they read).
    """

    priority = "VERY_HIGH"
    _write_iter: Callable[[int], None] | None = None  # set by before_train

    def __init__(self) -> None:
        self._keys: dict[str, str] = {}  # output key -> 'train/<key>', built once

    def before_train(self, runner: RunnerAPI) -> None:
        runner.message_hub.update_info_dict(
            {
                "epoch": runner.epoch,
                "iter": runner.iter,
                "max_epochs": runner.max_epochs,
                "max_iters": runner.max_iters,
            }
        )
        # 'iter' is written every iteration: through the hub's plain store, not the mapping
        self._write_iter = runner.message_hub.runtime_info.store_for("iter")

    def before_train_epoch(self, runner: RunnerAPI) -> None:
        runner.message_hub.update_info("epoch", runner.epoch)

    def before_train_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: DataBatch = None
    ) -> None:
        hub = runner.message_hub
        if self._write_iter is not None:
            self._write_iter(runner.iter)
        else:  # a subclass whose before_train did not call this one's
            hub.update_info("iter", runner.iter)
        groups = runner.optim_wrapper.optimizer.param_groups
        hub.update_scalar("train/lr", groups[0]["lr"])
        if len(groups) > 1:
            for i in range(1, len(groups)):
                hub.update_scalar(f"train/lr_group{i}", groups[i]["lr"])

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
    ) -> None:
        if not outputs:
            return
        hub, keys = runner.message_hub, self._keys
        for key, value in outputs.items():
            name = keys.get(key)
            if name is None:
                name = keys[key] = f"train/{key}"
            hub.update_scalar(name, value)

    def _metrics(self, runner: RunnerAPI, prefix: str, metrics: dict[str, Any] | None) -> None:
        for key, value in (metrics or {}).items():
            runner.message_hub.update_scalar(f"{prefix}/{key}", value)

    def after_val_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        self._metrics(runner, "val", metrics)

    def after_test_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        self._metrics(runner, "test", metrics)
