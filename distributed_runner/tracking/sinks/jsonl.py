"""JsonlSink: every record as one JSON line in ``work_dir/logs/scalars.jsonl``."""

from __future__ import annotations

import functools
import json
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from distributed_runner.core.redact import redact_text
from distributed_runner.core.registry import LOG_SINKS
from distributed_runner.tracking.sinks.base import LogRecord, LogSink

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@functools.lru_cache(maxsize=64)
def _json_template(mode: str, keys: tuple) -> str:
    """The line of a record with these scalar keys, with %-slots for step, epoch and the values:
    a run has a handful of these, and filling one costs a fraction of json.dumps (the same text:
    json writes a finite float as repr() does)."""
    return "".join(
        ['{"mode": ', json.dumps(mode).replace("%", "%%"), ', "step": %d, "epoch": %d']
        + [f", {json.dumps(k).replace('%', '%%')}: %r" for k in keys]
        + ["}\n"]
    )


def json_line(record: LogRecord) -> str:
    """``json.dumps({"mode": ..., "step": ..., "epoch": ..., **scalars}) + "\\n"``."""
    scalars = record.scalars
    if type(record.step) is int and type(record.epoch) is int:
        for value in scalars.values():
            if type(value) is not float or value - value != 0.0:  # not a float, or nan/inf
                break
        else:
            return _json_template(record.mode, tuple(scalars)) % (
                record.step,
                record.epoch,
                *scalars.values(),
            )
    line = {"mode": record.mode, "step": record.step, "epoch": record.epoch, **scalars}
    return redact_text(json.dumps(line)) + "\n"  # a value that is not a number may be text


@LOG_SINKS.register_module()
class JsonlSink(LogSink):
    """Appends (a resumed run continues the same file). Lines are flushed at most once a second
    (and at close), so a crashed run's file lacks at most its last second of records while the
    step pays for a write to the OS only rarely.

    Line: ``{"mode": "train", "step": 10, "epoch": 1, "loss": 0.41, "lr": 0.01, ...}``.
    """

    def __init__(self, filename: str = "logs/scalars.jsonl") -> None:
        self.filename = filename
        self._file: IO[str] | None = None
        self._flushed = 0.0

    def open(self, runner: RunnerAPI) -> None:
        path = Path(runner.work_dir) / self.filename
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: LogRecord) -> None:
        if self._file is None:
            return
        self._file.write(json_line(record))
        now = time.monotonic()
        if now - self._flushed > 1.0 or record.mode != "train":
            self._file.flush()
            self._flushed = now

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
