"""The run's log sinks as one service the Runner owns and every hook reaches as ``runner.sinks``.

Who names the sinks: hooks that subclass :class:`~hooks.extension_points.SinkProvider` (LoggerHook's
``sinks=`` argument). Who builds them: the Runner, once, when it is built — so a misspelled sink
is a one-line config error before any data loads, and on the Ray driver before any worker starts.
Who writes: LoggerHook decides *when* (intervals, validation); VisualizationHook and
MLflowCheckpointHook write images and files through the same sinks.

Training records are written a second later, in a batch, by
:class:`~distributed_runner.sinks.record_queue.RecordQueue` (why, and what keeps the order:
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
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..log import LOGGER_NAME
from ..preemption import TrainingPreempted
from .base import LogRecord, LogSink, build_sink, validate_sink_spec
from .record_queue import RecordQueue

if TYPE_CHECKING:
    from ..runner_api import RunnerAPI

_log = logging.getLogger(LOGGER_NAME)


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
