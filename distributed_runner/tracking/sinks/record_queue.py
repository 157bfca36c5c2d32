"""Training records written a second later, in a batch, in order.

LoggerHook assembles a training record on the training thread (its values are floats by then:
the cross-rank average is a collective, and a GPU tensor is read in a logging iteration only),
and :class:`SinkSet` hands it to this queue instead of formatting and writing it at once. A
daemon thread writes what is queued once a second, all of it together. Why: written one at a
time between two training steps, a record's formatting and writes ran with every cache cold
(measured ~100 µs of CPU a record in the user path, ~10 µs per iteration at a logger interval of
10); the same work in a batch costs a fraction of that, and the training thread pays only for an
append.

What stays as it was:

* **Order.** Anything else written to the run's log — a validation record, a checkpoint's line,
  a hook's warning — first writes the records queued before it, on the thread that writes it
  (:func:`~distributed_runner.core.log.write_queued_lines`, a filter on the run's own log handlers).
  So the log reads in the order things happened; only a bare ``print()`` is not ordered with
  the queued lines.
* **What a crash loses.** The thread writes and flushes within a second of a record, as
  :class:`~distributed_runner.core.log.LineFlusher` did for its lines, so a process killed outright
  loses at most its last second of records, as before; a run that raises writes them all when
  its sinks close; ``SinkSet.flush`` (before a checkpoint, before ``after_run``'s copies) and
  the end of a run write them all first.
* **Content.** The record carries its creation time; the terminal line's timestamp is that time,
  not the write's.
* **A hung training thread** does not hold its last records back: the writer is another thread.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable

from distributed_runner.core.log import LINE_FLUSHER, queued_line_sources, write_queued_lines
from distributed_runner.tracking.sinks.base import LogRecord

WRITE_SECONDS = 1.0  # a queued record waits at most about this long


class RecordQueue:
    """Records waiting for ``write_now`` (module docstring). ``put`` costs an append, and an
    ``Event.set`` when the queue was empty."""

    def __init__(self, write_now: Callable[[LogRecord], None]) -> None:
        self._write_now = write_now
        self._pending: deque[LogRecord] = deque()
        self._lock = threading.RLock()  # re-entered when a sink's warning is logged mid-drain
        self._draining = False
        self._wake = threading.Event()
        self._pid = 0
        self._closed = False

    def put(self, record: LogRecord) -> None:
        pending = self._pending
        pending.append(record)
        if len(pending) == 1:
            if self._pid != os.getpid() or self._closed:
                self._start()
            self._wake.set()

    def __len__(self) -> int:
        return len(self._pending)

    def drain(self) -> None:
        """Write every queued record now, in order, on the calling thread."""
        if not self._pending:
            return
        with self._lock:
            if self._draining:  # this thread is already draining (a sink logged a warning)
                return
            self._draining = True
            try:
                pending, write = self._pending, self._write_now
                while pending:
                    write(pending.popleft())
            finally:
                self._draining = False

    def close(self) -> None:
        """Write what is queued; the thread ends at its next wake."""
        self.drain()
        self._closed = True
        queued_line_sources.discard(self)
        self._wake.set()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._wake = threading.Event()
        self._closed = False
        queued_line_sources.add(self)
        # held weakly, by the thread too: a queue nobody closed (a test's SinkSet) still goes
        threading.Thread(
            target=_write_periodically,
            args=(weakref.ref(self), self._wake),
            name="drun-record-writer",
            daemon=True,
        ).start()

    def _after_fork_in_child(self) -> None:
        """A forked child (a DataLoader worker) writes none of its parent's records."""
        self._lock, self._pending, self._pid, self._draining = threading.RLock(), deque(), 0, False


def _reset_all_in_child() -> None:
    for queue in list(queued_line_sources):
        queue._after_fork_in_child()


# before a fork the parent writes what is queued (the child must not write it a second time)
os.register_at_fork(before=write_queued_lines, after_in_child=_reset_all_in_child)


def _write_periodically(queue_ref: weakref.ref, wake: threading.Event) -> None:
    while True:
        wake.wait()
        time.sleep(WRITE_SECONDS)  # the records of this second share one batch
        queue = queue_ref()
        if queue is None or queue._wake is not wake or queue._closed:  # gone, restarted
            return  # (a fork) or closed
        wake.clear()
        if len(queue):
            try:
                queue.drain()
                LINE_FLUSHER.flush_now()  # on disk within the second, as the lines were before
            except Exception:  # noqa: BLE001 - a sink's failure is reported by SinkSet itself
                pass
        del queue
