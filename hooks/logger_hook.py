"""LoggerHook: turns the MessageHub's scalars into records for the configured sinks."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from distributed_runner import dist
from distributed_runner.errors import ConfigError
from distributed_runner.registry import HOOKS
from distributed_runner.sinks import LogRecord, build_sink

from .hook import DataBatch, Hook


@HOOKS.register_module()
class LoggerHook(Hook):
    """Every ``interval`` training iterations (and after each validation/test) write one record
    to each sink: ``sinks=['terminal', 'jsonl']`` by default; any ``dict(type=...)`` from the
    LOG_SINKS registry or a ``LogSink`` instance also works.

    Training values are smoothed over the iterations since the last record (``lr`` is the current
    value) and averaged across ranks. ``ignore_last=False`` also logs the last iterations of an
    epoch that do not fill an interval.
    Ranks: all compute (the cross-rank average is a collective); rank 0 writes.
    """

    priority = "BELOW_NORMAL"

    def __init__(self, interval: int = 10, ignore_last: bool = True,
                 sinks: Sequence[Any] = ("terminal", "jsonl")) -> None:
        if int(interval) < 1:
            raise ConfigError("default_hooks.logger.interval", "must be >= 1")
        self.interval = int(interval)
        self.ignore_last = ignore_last
        self.sink_specs = list(sinks)
        self.sinks: list = []
        self._last_logged = 0  # runner.iter when the last train record was written

    def before_run(self, runner) -> None:
        if runner.rank == 0:
            self.sinks = [build_sink(s, f"default_hooks.logger.sinks[{i}]")
                          for i, s in enumerate(self.sink_specs)]
            for sink in self.sinks:
                sink.open(runner)

    def before_train(self, runner) -> None:
        self._last_logged = runner.iter
        self._by_epoch = getattr(runner.train_loop, "by_epoch", True)
        self._epoch_length = len(runner.train_dataloader)
        # the last batch of an epoch is logged even when it does not fill an interval
        self._log_tail = self._by_epoch and (not self.ignore_last
                                             or self._epoch_length <= self.interval)

    def after_train_iter(self, runner, batch_idx: int, data_batch: DataBatch = None,
                         outputs: Optional[dict] = None) -> None:
        if (batch_idx + 1) % self.interval == 0 or (
                self._log_tail and batch_idx + 1 == self._epoch_length):
            self._log_train(runner, batch_idx)

    def _log_train(self, runner, batch_idx: int) -> None:
        hub = runner.message_hub
        window = max(runner.iter + 1 - self._last_logged, 1)
        self._last_logged = runner.iter + 1
        current, smoothed = {}, {}
        for key, buf in hub.log_scalars.items():
            if key.startswith("train/") and len(buf):
                name = key[6:]
                if name.startswith("lr"):
                    current[name] = buf.current()
                else:
                    smoothed[name] = buf.mean(window)
        if dist.is_distributed() and smoothed:
            avg = dist.all_reduce(torch.tensor(list(smoothed.values()), dtype=torch.float64),
                                  "mean").tolist()
            smoothed = dict(zip(smoothed, avg))
        if runner.rank != 0:
            return
        scalars = {**current, **smoothed}
        if runner.device.type == "cuda":
            scalars["memory"] = float(torch.cuda.max_memory_allocated(runner.device) // 2**20)
        info = {"by_epoch": self._by_epoch, "iter_in_epoch": batch_idx + 1,
                "epoch_length": self._epoch_length, "max_iters": runner.max_iters}
        eta = hub.get_info("eta")
        if eta is not None:
            info["eta"] = eta
        self._write(LogRecord("train", runner.iter + 1, runner.epoch + 1, scalars, info))

    def _log_eval(self, runner, mode: str, metrics: Optional[dict]) -> None:
        if runner.rank != 0:
            return
        scalars = {k: float(v) for k, v in (metrics or {}).items()}
        for name in ("time", "data_time"):
            buf = runner.message_hub.log_scalars.get(f"{mode}/{name}")
            if buf is not None and len(buf):
                scalars[name] = buf.mean(len(runner.val_dataloader if mode == "val"
                                             else runner.test_dataloader))
        info = {"by_epoch": getattr(runner.train_loop, "by_epoch", True)}
        self._write(LogRecord(mode, runner.iter, runner.epoch, scalars, info))

    def after_val_epoch(self, runner, metrics: Optional[dict] = None) -> None:
        self._log_eval(runner, "val", metrics)

    def after_test_epoch(self, runner, metrics: Optional[dict] = None) -> None:
        self._log_eval(runner, "test", metrics)

    def _write(self, record: LogRecord) -> None:
        for sink in self.sinks:
            sink.write(record)

    def sink_of_type(self, cls: type) -> object | None:
        """The first configured sink that is a ``cls`` (rank 0; None elsewhere)."""
        return next((s for s in self.sinks if isinstance(s, cls)), None)

    def state_dict(self) -> dict:
        """Sinks that must survive resume (the MLflow run id) keep their state here."""
        return {"sinks": [s.state_dict() if hasattr(s, "state_dict") else None
                          for s in self.sinks]}

    def load_state_dict(self, state: dict) -> None:
        for sink, sink_state in zip(self.sinks, state.get("sinks", [])):
            if sink_state is not None and hasattr(sink, "load_state_dict"):
                sink.load_state_dict(sink_state)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        for sink in self.sinks:
            sink.flush()

    def after_run(self, runner) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []
