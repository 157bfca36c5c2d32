"""TerminalSink: one MMEngine-style line per logging interval, through the run's logger."""
from __future__ import annotations

import datetime
from typing import Any

from ..registry import LOG_SINKS
from .base import LogRecord, LogSink

_FIRST = ("lr", "eta", "time", "data_time", "memory")


def format_value(key: str, value: float) -> str:
    if key == "lr" or key.startswith("lr_"):
        return f"{value:.4e}"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def format_record(record: LogRecord) -> str:
    """``Epoch(train) [2][ 10/45]  lr: 1.0000e-02  eta: 0:00:12  time: 0.0031 ... loss: 0.41``."""
    info = record.info
    if record.mode == "train":
        if info.get("by_epoch", True):
            n = info.get("epoch_length", 0)
            where = f"Epoch(train) [{record.epoch}][{info.get('iter_in_epoch', 0):>{len(str(n))}}/{n}]"
        else:
            m = info.get("max_iters", 0)
            where = f"Iter(train) [{record.step:>{len(str(m))}}/{m}]"
    else:
        where = f"Epoch({record.mode}) [{record.epoch}]" if info.get("by_epoch", True) \
            else f"Iter({record.mode}) [{record.step}]"
    parts = [where]
    if "eta" in info:
        parts.append(f"eta: {datetime.timedelta(seconds=int(info['eta']))}")
    scalars = record.scalars
    for key in [k for k in _FIRST if k in scalars] + [k for k in scalars if k not in _FIRST]:
        parts.append(f"{key}: {format_value(key, scalars[key])}")
    return "  ".join(parts)


@LOG_SINKS.register_module()
class TerminalSink(LogSink):
    """Plain lines through ``runner.logger`` (so they also land in ``work_dir/logs/run.log``)."""

    def open(self, runner: Any) -> None:
        self._logger = runner.logger

    def write(self, record: LogRecord) -> None:
        self._logger.info(format_record(record))
