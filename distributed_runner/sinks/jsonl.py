"""JsonlSink: every record as one JSON line in ``work_dir/logs/scalars.jsonl``."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, IO

from ..registry import LOG_SINKS
from .base import LogRecord, LogSink


@LOG_SINKS.register_module()
class JsonlSink(LogSink):
    """Appends (a resumed run continues the same file); each line is flushed as it is written so
    a crashed run's file is complete up to its last interval.

    Line: ``{"mode": "train", "step": 10, "epoch": 1, "loss": 0.41, "lr": 0.01, ...}``.
    """

    def __init__(self, filename: str = "logs/scalars.jsonl") -> None:
        self.filename = filename
        self._file: IO[str] | None = None

    def open(self, runner: Any) -> None:
        path = Path(runner.work_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: LogRecord) -> None:
        if self._file is None:
            return
        line = {"mode": record.mode, "step": record.step, "epoch": record.epoch, **record.scalars}
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
