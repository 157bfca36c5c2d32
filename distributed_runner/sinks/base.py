"""The sink interface LoggerHook writes to."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..registry import LOG_SINKS


@dataclass
class LogRecord:
    """One logging event: a training interval, or a validation/test result.

    ``step`` is the number of completed training iterations (the x-axis every sink shares);
    ``epoch`` counts from 1 for display; ``scalars`` are floats; ``info`` carries display-only
    values (``eta``, ``iter_in_epoch``, ``epoch_length``, ``max_iters``, ``by_epoch``).
    """

    mode: str
    step: int
    epoch: int
    scalars: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)


class LogSink:
    """Receives records on the main process only. ``open`` once per run, ``close`` at its end
    (also after a failure, so buffered data is flushed)."""

    def open(self, runner: Any) -> None:
        """Called at ``before_run``."""

    def write(self, record: LogRecord) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Make everything written so far durable; called before each checkpoint is saved, so
        a resumed run finds every record up to its checkpoint."""

    def close(self) -> None:
        """Called at ``after_run``."""


_ALIASES = {"terminal": "TerminalSink", "jsonl": "JsonlSink", "json": "JsonlSink",
            "tensorboard": "TensorBoardSink", "parquet": "ParquetSink", "mlflow": "MLflowSink"}


def build_sink(spec: Any, key: str) -> LogSink:
    """A sink from ``'terminal'``, ``dict(type='JsonlSink', ...)`` or a LogSink instance."""
    if isinstance(spec, LogSink):
        return spec
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict):
        raise ConfigError(key, "a sink is a name ('terminal', 'jsonl'), dict(type=...) or a LogSink")
    spec = dict(spec)
    spec["type"] = _ALIASES.get(spec.get("type"), spec.get("type"))
    sink = LOG_SINKS.build(spec, key)
    if not isinstance(sink, LogSink):
        raise ConfigError(f"{key}.type", f"{type(sink).__name__} is not a LogSink")
    return sink
