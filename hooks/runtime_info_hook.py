"""RuntimeInfoHook: publishes counters, learning rates, losses and metrics to the MessageHub."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import DataBatch, Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class RuntimeInfoHook(Hook):
    """Keep the MessageHub current so modules without the runner can read the run's state.

    Runtime info: ``epoch``, ``iter``, ``max_epochs``, ``max_iters``. Scalars: ``train/lr`` (first
    param group; ``train/lr_groupN`` for others), every entry of the train step's outputs as
    ``train/<key>``, validation/test metrics as ``val/<key>`` / ``test/<key>``.
    Ranks: all (each rank keeps its own hub; loggers average across ranks when they read).
    """

    priority = "VERY_HIGH"
    # the hub's writers of what this hook records every iteration (MessageHub.scalar_writer),
    # taken at before_train; None: a subclass whose before_train did not call this one's
    _write_iter: Callable[[int], None] | None = None
    _write_lr: Callable[[Any], None] | None = None
    _out_writers: dict[str, Callable[[Any], None]] | None = None

    def before_train(self, runner: RunnerAPI) -> None:
        runner.message_hub.update_info_dict(
            {
                "epoch": runner.epoch,
                "iter": runner.iter,
                "max_epochs": runner.max_epochs,
                "max_iters": runner.max_iters,
            }
        )
        self._start_writing(runner)

    def _start_writing(self, runner: RunnerAPI) -> None:
        hub = runner.message_hub
        # 'iter' is written every iteration: through the hub's plain store, not the mapping
        self._write_iter = hub.runtime_info.store_for("iter")
        self._write_lr = hub.scalar_writer("train/lr")
        self._out_writers = {}  # output key -> the writer of 'train/<key>'

    def before_train_epoch(self, runner: RunnerAPI) -> None:
        runner.message_hub.update_info("epoch", runner.epoch)

    def before_train_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: DataBatch = None
    ) -> None:
        if self._write_lr is None:
            self._start_writing(runner)
        self._write_iter(runner.iter)  # type: ignore[misc]  # set with _write_lr
        groups = runner.optim_wrapper.optimizer.param_groups
        self._write_lr(groups[0]["lr"])  # type: ignore[misc]  # set above
        if len(groups) > 1:
            hub = runner.message_hub
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
        writers = self._out_writers
        if writers is None:
            self._start_writing(runner)
            writers = self._out_writers
        for key, value in outputs.items():
            write = writers.get(key)  # type: ignore[union-attr]  # set above
            if write is None:
                write = writers[key] = runner.message_hub.scalar_writer(f"train/{key}")  # type: ignore[index]
            write(value)

    def _metrics(self, runner: RunnerAPI, prefix: str, metrics: dict[str, Any] | None) -> None:
        for key, value in (metrics or {}).items():
            runner.message_hub.update_scalar(f"{prefix}/{key}", value)

    def after_val_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        self._metrics(runner, "val", metrics)

    def after_test_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        self._metrics(runner, "test", metrics)
