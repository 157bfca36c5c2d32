"""The run's log sinks as one service the Runner owns and every hook reaches as ``runner.sinks``.

Who names the sinks: hooks that subclass
:class:`~distributed_runner.engine.extension_points.SinkProvider` (LoggerHook's ``sinks=``
argument). Who builds them: the Runner, once, when it is built — so a misspelled sink
is a one-line config error before any data loads, and on the Ray driver before any worker starts.
Who writes: LoggerHook decides *when* (intervals, validation); VisualizationHook and
MLflowCheckpointHook hand images and files to the same sinks through :meth:`SinkSet.add_image` and
:meth:`SinkSet.log_artifact`, which offer them to every sink — whichever can keep them does (the
optional capabilities of :class:`~distributed_runner.tracking.sinks.base.LogSink`), so no hook
names a sink class.

Training records are written a second later, in a batch, by
:class:`~distributed_runner.tracking.sinks.record_queue.RecordQueue` (why, and what keeps the order:
there); every other record first writes the queued ones, then itself, at once.

Lifecycle: :meth:`SinkSet.opened` around each ``train()``/``val()``/``test()`` (outside
``before_run``/``after_run``, so every hook may write at both), which tells each sink the outcome
(``FINISHED``, ``FAILED``, ``KILLED``) before closing it; :meth:`SinkSet.flush` before each
checkpoint is written, so a resumed run finds every record up to its checkpoint. Only rank 0
builds real sinks; on the other ranks the set is empty and every call is free. A sink that fails
is reported once and skipped; the others still write.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.log import LOGGER_NAME
from distributed_runner.core.preemption import TrainingPreempted
from distributed_runner.tracking.sinks.base import (
    LogRecord,
    LogSink,
    build_sink,
    validate_sink_spec,
)
from distributed_runner.tracking.sinks.record_queue import RecordQueue

if TYPE_CHECKING:
    import numpy as np

    from distributed_runner.core.runner_api import RunnerAPI

_log = logging.getLogger(LOGGER_NAME)
CAPABILITIES = ("add_image", "log_artifact")  # LogSink's optional methods (see its docstring)


class SinkSet:
    """Named, built sinks with failure isolation (see the module docstring)."""

    def __init__(self, sinks: Sequence[tuple[str, LogSink]] = ()) -> None:
        self._sinks: list[tuple[str, LogSink]] = list(sinks)
        self._failures: dict[int, int] = {}
        self._open: list[tuple[str, LogSink]] = []
        self._queue = RecordQueue(self._write_now)

    @classmethod
    def build(cls, specs: Sequence[tuple[str, Any]], build: bool = True) -> SinkSet:
        """Validate every ``(config key, spec)``; build them when ``build`` (rank 0; building
        validates each first, so a bad spec is the same one-line error either way)."""
        if not build:
            for key, spec in specs:
                validate_sink_spec(spec, key)
            return cls()
        return cls([(key, build_sink(spec, key)) for key, spec in specs])

    # -- what hooks use ------------------------------------------------------------------------
    def __iter__(self) -> Iterator[LogSink]:
        return iter([sink for _, sink in self._sinks])

    def __len__(self) -> int:
        return len(self._sinks)

    def of_type(self, cls: type) -> Any:
        """The first sink that is a ``cls`` (None on ranks other than 0, or if there is none)."""
        return next((sink for _, sink in self._sinks if isinstance(sink, cls)), None)

    def describe(self) -> str:
        return ", ".join(type(sink).__name__ for _, sink in self._sinks) or "none"

    def add_image(self, tag: str, image: np.ndarray, step: int) -> int:
        """Offer an ``H x W x 3`` uint8 image to every open sink (TensorBoard keeps it); how many
        kept it — 0 when none can, which is no error: the hook has written its own file."""
        return self._offer("add_image", tag, image, step)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> int:
        """Offer a file, or a folder's files, to every open sink (MLflow uploads it); how many
        kept it, so a hook can say when nothing did."""
        return self._offer("log_artifact", path, artifact_path)

    def offers(self, capability: str) -> bool:
        """Whether an open sink implements ``capability`` (``'add_image'``, ``'log_artifact'``):
        asked before any work, so MLflowCheckpointHook can say at once that nothing would keep
        its checkpoints instead of finding out file by file (or not at all, with none saved)."""
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown sink capability {capability!r}: {', '.join(CAPABILITIES)}")
        default = getattr(LogSink, capability)
        return any(
            getattr(type(sink), capability, default) is not default for _, sink in self._open
        )

    def _offer(self, capability: str, *args: Any) -> int:
        """Call ``capability`` on every open sink; the number that returned True. Unlike a record,
        an image or file is a hook's explicit request: a sink that raises does not stop the others,
        but the first error is raised once all had their turn, so the calling hook's ``on_error``
        decides (a checkpoint upload that failed must not pass as a warning counted once); any
        further errors are logged here."""
        kept, errors = 0, []
        for key, sink in self._open:
            try:
                kept += bool(getattr(sink, capability)(*args))
            except Exception as exc:  # noqa: BLE001 - one broken sink must not starve the rest
                errors.append(exc)
                if len(errors) > 1:
                    _log.warning(
                        "sink %s (%s) failed to %s too: %s: %s",
                        type(sink).__name__,
                        key,
                        capability,
                        type(exc).__name__,
                        exc,
                    )
        if errors:
            raise errors[0]
        return kept

    def write(self, record: LogRecord) -> None:
        """Write ``record`` to every open sink (a training record within a second, after those
        before it; any other at once, after those before it); a failing sink is reported once
        and skipped."""
        if not self._open:
            return
        if record.mode == "train":
            self._queue.put(record)
            return
        self._queue.drain()
        self._write_now(record)

    def _write_now(self, record: LogRecord) -> None:
        for i, (key, sink) in enumerate(self._open):
            try:
                sink.write(record)
            except Exception as exc:  # noqa: BLE001 - one broken sink must not silence the rest
                self._failed(i, key, sink, exc)

    def flush(self) -> None:
        """Write the queued records, then make every sink's records durable."""
        self._queue.drain()
        for i, (key, sink) in enumerate(self._open):
            try:
                sink.flush()
            except Exception as exc:  # noqa: BLE001
                self._failed(i, key, sink, exc)

    def _failed(self, i: int, key: str, sink: LogSink, exc: Exception) -> None:
        self._failures[i] = self._failures.get(i, 0) + 1
        if self._failures[i] == 1:
            _log.warning(
                "sink %s failed (%s: %s; configured at %s); it is skipped for this "
                "record and later failures are only counted",
                type(sink).__name__,
                type(exc).__name__,
                exc,
                key,
            )

    # -- lifecycle (the Runner's) ----------------------------------------------------------------
    @contextlib.contextmanager
    def opened(self, runner: RunnerAPI) -> Iterator[SinkSet]:
        """Open every sink for one ``train()``/``val()``/``test()``; close them at the end, also
        when it raised (buffered records are flushed)."""
        self._open = []
        for key, sink in self._sinks:
            try:
                sink.open(runner)
            except ConfigError:
                self.close("FAILED")
                raise
            except Exception as exc:  # noqa: BLE001 - a sink that cannot open is left out
                _log.warning(
                    "sink %s (%s) could not open (%s: %s); this run goes on without it",
                    type(sink).__name__,
                    key,
                    type(exc).__name__,
                    exc,
                )
                continue
            self._open.append((key, sink))
        outcome = "FAILED"
        try:
            yield self
            outcome = "FINISHED"
        except TrainingPreempted:
            outcome = "KILLED"
            raise
        finally:
            self.close(outcome)

    def close(self, outcome: str = "FINISHED") -> None:
        """Write the queued records, tell every open sink how the run ended
        (:meth:`LogSink.finish`), then close it."""
        self._queue.close()
        for key, sink in self._open:
            try:
                sink.finish(outcome)
            except Exception as exc:  # noqa: BLE001
                _log.warning(
                    "sink %s (%s) failed to record the outcome %s: %s: %s",
                    type(sink).__name__,
                    key,
                    outcome,
                    type(exc).__name__,
                    exc,
                )
        for key, sink in self._open:
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001
                _log.warning(
                    "sink %s (%s) failed to close: %s: %s",
                    type(sink).__name__,
                    key,
                    type(exc).__name__,
                    exc,
                )
        self._open = []

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> list:
        """Per sink, what must survive resume (the MLflow run id), or None."""
        return [
            sink.state_dict() if hasattr(sink, "state_dict") else None for _, sink in self._sinks
        ]

    def load_state_dict(self, states: Sequence[Any]) -> None:
        # not strict: a resumed run may name more sinks than its checkpoint (those start fresh)
        for (_, sink), state in zip(self._sinks, states, strict=False):
            if state is not None and hasattr(sink, "load_state_dict"):
                sink.load_state_dict(state)
