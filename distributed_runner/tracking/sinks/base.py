"""The sink interface LoggerHook writes to."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.core.errors import ConfigError, closest
from distributed_runner.core.registry import LOG_SINKS
from distributed_runner.core.signatures import check_arguments

if TYPE_CHECKING:
    import numpy as np

    from distributed_runner.core.runner_api import RunnerAPI


@dataclass
class LogRecord:
    """One logging event: a training interval, or a validation/test result.

    ``step`` is the number of completed training iterations (the x-axis every sink shares);
    ``epoch`` counts from 1 for display; ``scalars`` are floats; ``info`` carries display-only
    values (``eta``, ``iter_in_epoch``, ``epoch_length``, ``max_iters``, ``by_epoch``).

    ``metric_step`` is the step metric backends (TensorBoard, MLflow, wandb) chart the record
    at when it is not ``step``: the epoch, for validation metrics of an epoch-based run with
    LoggerHook's ``log_metric_by_epoch=True`` (MMEngine's default). Files (JSON lines, Parquet)
    keep ``step`` and ``epoch`` both, so ``drun plot`` draws every curve on one axis.

    ``created`` (``time.time()`` when the record was made) dates the terminal line: a training
    record is written up to a second later (:mod:`~distributed_runner.tracking.sinks.record_queue`).
    """

    mode: str
    step: int
    epoch: int
    scalars: dict[str, float]
    info: dict[str, Any] = field(default_factory=dict)
    metric_step: int | None = None
    created: float = field(default_factory=time.time)

    @property
    def chart_step(self) -> int:
        """The step metric backends use: ``metric_step`` if set, else ``step``."""
        return self.step if self.metric_step is None else self.metric_step


class LogSink:
    """Receives records on the main process only. ``open`` once per run, ``close`` at its end
    (also after a failure, so buffered data is flushed).

    Optional capabilities — :meth:`add_image`, :meth:`log_artifact` — are what hooks hand over
    besides records (through ``runner.sinks``, which asks every sink): a sink that can keep them
    overrides the method and returns True; the defaults keep nothing and return False, so a hook
    never needs to know which sink classes exist.
    """

    def open(self, runner: RunnerAPI) -> None:
        """Called before each ``train()``/``val()``/``test()`` (before ``before_run``)."""

    def write(self, record: LogRecord) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Make everything written so far durable; called before each checkpoint is saved, so
        a resumed run finds every record up to its checkpoint."""

    def finish(self, outcome: str) -> None:
        """Told, just before ``close``, how the run ended: ``'FINISHED'``, ``'FAILED'`` (it
        raised) or ``'KILLED'`` (preempted after its checkpoint) — MLflow's run statuses."""

    def close(self) -> None:
        """Called after ``after_run``, also when the run raised."""

    # -- optional capabilities (see the class docstring) ----------------------------------------
    def add_image(self, tag: str, image: np.ndarray, step: int) -> bool:
        """Keep an ``H x W x 3`` uint8 image under ``tag`` at ``step`` (VisualizationHook's
        predictions); True if kept. The default keeps nothing: most sinks hold only scalars."""
        return False

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> bool:
        """Keep a file, or a folder's files, under ``artifact_path`` (checkpoints, images); True
        if kept. The default keeps nothing: only a tracking server stores files."""
        return False


_ALIASES = {
    "terminal": "TerminalSink",
    "jsonl": "JsonlSink",
    "json": "JsonlSink",
    "tensorboard": "TensorBoardSink",
    "parquet": "ParquetSink",
    "mlflow": "MLflowSink",
    "wandb": "WandbSink",
}


def validate_sink_spec(spec: Any, key: str) -> None:
    """Raise a one-line :class:`ConfigError` unless ``spec`` names a known sink with arguments its
    constructor takes — without building it (the Ray driver checks a config this way)."""
    if isinstance(spec, LogSink):
        return
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(
            key, "a sink is a name ('terminal', 'jsonl'), dict(type=...) or a LogSink"
        )
    name = spec["type"]
    if isinstance(name, str) and name not in _ALIASES and LOG_SINKS.get(name) is None:
        near = closest(name, list(_ALIASES) + LOG_SINKS.keys())[:1]
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(
            key,
            f"unknown sink {name!r}{hint}; built in: "
            f"{', '.join(n for n in _ALIASES if n != 'json')}, or a class "
            f"registered with @LOG_SINKS.register_module()",
        )
    cls = LOG_SINKS.resolve(_ALIASES.get(name, name), key)
    check_arguments(cls, {k: v for k, v in spec.items() if k != "type"}, key)


def build_sink(spec: Any, key: str) -> LogSink:
    """A sink from ``'terminal'``, ``dict(type='JsonlSink', ...)`` or a LogSink instance."""
    validate_sink_spec(spec, key)
    if isinstance(spec, LogSink):
        return spec
    if isinstance(spec, str):
        spec = {"type": spec}
    spec = dict(spec)
    spec["type"] = _ALIASES.get(spec["type"], spec["type"])
    sink = LOG_SINKS.build(spec, key)
    if not isinstance(sink, LogSink):
        raise ConfigError(f"{key}.type", f"{type(sink).__name__} is not a LogSink")
    return sink
