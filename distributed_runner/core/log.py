"""The run's Python logger: rank 0 speaks at INFO, other ranks only warn.

Every message also goes to ``work_dir/logs/run.log`` (rank 0) so a cluster run's log survives the
terminal it was printed on.

The training lines (one every few iterations) take :func:`log_info_line` instead of
``logger.info``: the same text to the same handlers, but the run's own two handlers get the line
formatted once and written directly, without a ``LogRecord`` and the logging module's per-handler
formatting — in the user's path that machinery was most of what a logged iteration cost. Any
other handler (a user's, pytest's) and any filter still get a real record the normal way.

LoggerHook's lines reach :func:`log_info_line` from a queue a second late, in a batch
(:mod:`distributed_runner.tracking.sinks.record_queue`); so that the log still reads in the order
things happened, every other message to the run's own handlers first writes what that queue holds
(:func:`write_queued_lines`, called from the handlers' filter).

Those lines are flushed within a second, not one by one: a file, or a stdout that is not a
terminal (``drun train > out.log``, ``ray job logs``), gets them from :class:`LineFlusher`'s
thread at most once a second — a flush is a write to the OS, which costs a logged iteration more
than formatting its line. A terminal gets each line at once, as does every other message, whose
flush also takes the training lines before it. A process killed outright loses at most its last
second of training lines; the end of a run, a checkpoint and ``logging.shutdown`` flush them all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from distributed_runner.core.redact import redact_text

LOGGER_NAME = "distributed_runner"


_MARK = "_distributed_runner_handler"


_LAZY = "_distributed_runner_lazy_flush"  # training lines may wait for LineFlusher


FLUSH_SECONDS = 1.0


DATE_FORMAT = "%m/%d %H:%M:%S"


class _SecondsFormatter(logging.Formatter):
    """``MM/DD HH:MM:SS LEVEL [rank r] message``, timestamps to the second, formatted once per
    second: the terminal and the log file share this formatter, and a training line is written
    every few iterations."""

    _second = -1
    _text = ""

    def __init__(self, rank: int) -> None:
        self.rank_prefix = f"[rank {rank}] " if rank else ""
        super().__init__(
            f"%(asctime)s %(levelname)s {self.rank_prefix}%(message)s", datefmt=DATE_FORMAT
        )

    def _time_text(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._second = second
            self._text = time.strftime(self.datefmt or DATE_FORMAT, self.converter(created))
        return self._text

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return self._time_text(record.created)

    def format(self, record: logging.LogRecord) -> str:
        """The line, exception text included, with secrets masked (:func:`redact_text`): the
        terminal and the run log are where lines leave the process, whoever wrote them — this
        project, or a library whose exception a warning quotes."""
        return redact_text(super().format(record))

    def info_line(self, message: str, created: float) -> str:
        """What :meth:`format` gives for an INFO record of ``message`` created at ``created``
        (plain text: no exception, no stack)."""
        return redact_text(f"{self._time_text(created)} INFO {self.rank_prefix}{message}")


queued_line_sources: weakref.WeakSet = weakref.WeakSet()


def write_queued_lines() -> None:
    """Write the training lines still queued, on this thread (before any other line, and before
    a fork: the child must not write them a second time)."""
    for source in list(queued_line_sources):
        source.drain()


class _QueuedLinesFirst(logging.Filter):
    """On the run's own handlers: before a message is emitted, the queued training lines are
    written (see the module docstring). Lets every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        write_queued_lines()
        return True


QUEUED_LINES_FIRST = _QueuedLinesFirst()


def _only_ours(filters: list) -> bool:
    return not filters or (len(filters) == 1 and filters[0] is QUEUED_LINES_FIRST)


def setup_logger(work_dir: Path | None, rank: int, level: str | int = "INFO") -> logging.Logger:
    """(Re)configure the project logger for this process; returns it."""
    logger = logging.getLogger(LOGGER_NAME)
    LINE_FLUSHER.flush_now()  # the old handlers' lines, before they close
    for h in list(logger.handlers):
        if getattr(h, _MARK, False):
            logger.removeHandler(h)
            h.close()
    logger.setLevel(level if rank == 0 else logging.WARNING)
    logger.propagate = False
    fmt = _SecondsFormatter(rank)
    stream = logging.StreamHandler(sys.stdout)
    stream.setFormatter(fmt)
    stream.addFilter(QUEUED_LINES_FIRST)
    setattr(stream, _MARK, True)
    setattr(stream, _LAZY, not _is_terminal(sys.stdout))
    logger.addHandler(stream)
    if work_dir is not None and rank == 0:
        (work_dir / "logs").mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(work_dir / "logs" / "run.log")
        file_handler.setFormatter(fmt)
        file_handler.addFilter(QUEUED_LINES_FIRST)
        setattr(file_handler, _MARK, True)
        setattr(file_handler, _LAZY, True)
        logger.addHandler(file_handler)
    return logger


def is_file_handler(handler: logging.Handler) -> bool:
    return hasattr(handler, "baseFilename")


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class LineFlusher:
    """Flushes handlers that were written to without a flush, at most once a second, from one
    daemon thread started on first use (again in a forked child, after the parent flushed before
    the fork). Waking it costs the writer a set lookup, and an ``Event.set`` at most once a
    second."""

    def __init__(self) -> None:
        self._pending: set[logging.Handler] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pid = 0

    def wrote(self, handler: logging.Handler) -> None:
        """``handler`` was written to and not flushed: flush it within FLUSH_SECONDS."""
        if handler in self._pending:
            return
        with self._lock:
            self._pending.add(handler)
        if self._pid != os.getpid():
            self._start()
        self._wake.set()

    def flush_now(self) -> None:
        """Flush every pending handler now (the end of a run, a checkpoint)."""
        with self._lock:
            handlers, self._pending = self._pending, set()
        for handler in handlers:
            # a closed stream: nothing left to flush into
            with contextlib.suppress(Exception):
                handler.flush()

    def _start(self) -> None:
        self._pid = os.getpid()
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="drun-log-flush", daemon=True).start()

    def _run(self) -> None:
        wake = self._wake
        while True:
            wake.wait()
            time.sleep(FLUSH_SECONDS)  # the lines of this second share one flush
            wake.clear()
            self.flush_now()

    def _after_fork_in_child(self) -> None:
        self._lock, self._pending, self._pid = threading.Lock(), set(), 0


LINE_FLUSHER = LineFlusher()


os.register_at_fork(before=LINE_FLUSHER.flush_now, after_in_child=LINE_FLUSHER._after_fork_in_child)


def log_info_line(
    logger: logging.Logger,
    message: str,
    handlers: Iterable[logging.Handler] | None = None,
    flush_now: bool = False,
    created: float | None = None,
    queued: bool = False,
) -> None:
    """``logger.info(message)`` for a line written every few iterations (module docstring);
    ``handlers``: only these of the logger's handlers (e.g. the files while a progress bar owns
    the terminal); ``flush_now``: no waiting for LineFlusher (a line a person waits for);
    ``created``: when the line's event happened (``time.time()``; default: now); ``queued``: the
    line comes from the record queue itself — any other line first writes what is queued."""
    if not logger.isEnabledFor(logging.INFO):
        return
    if not queued:
        write_queued_lines()
    record = None
    text = None
    if created is None:
        created = time.time()
    for handler in logger.handlers if handlers is None else handlers:
        if handler.level > logging.INFO:
            continue
        fmt = handler.formatter
        if (
            getattr(handler, _MARK, False)
            and type(fmt) is _SecondsFormatter
            and _only_ours(handler.filters)
            and not logger.filters
        ):
            if text is None:
                text = fmt.info_line(message, created) + "\n"
            try:
                with handler.lock:  # type: ignore[union-attr]  # created with the handler
                    handler.stream.write(text)  # type: ignore[attr-defined]  # a StreamHandler
                if flush_now or not getattr(handler, _LAZY, False):
                    handler.flush()
                else:
                    LINE_FLUSHER.wrote(handler)
                continue
            except Exception:  # noqa: BLE001 - reported as logging reports a failed emit
                pass
        if record is None:
            record = logger.makeRecord(logger.name, logging.INFO, __file__, 0, message, (), None)
            record.created = created
            if logger.filters and not logger.filter(record):
                return
        handler.handle(record)


def current_logger() -> logging.Logger:
    """The run's logger, from anywhere (MMEngine: ``MMLogger.get_current_instance()``)."""
    return logging.getLogger(LOGGER_NAME)


class MMLogger:
    """MMEngine's ``MMLogger.get_current_instance()``, for hooks that call it (the run's
    logger, as :func:`current_logger`)."""

    get_current_instance = staticmethod(current_logger)


def print_log(
    msg: str, logger: logging.Logger | str | None = None, level: int = logging.INFO
) -> None:
    """MMEngine's ``print_log``: ``logger=None`` prints; ``'current'`` logs to the run's logger;
    ``'silent'`` drops the message; a logger or a logger's name logs there."""
    if logger is None:
        print(msg)
    elif logger == "silent":
        return
    elif logger == "current":
        current_logger().log(level, msg)
    elif isinstance(logger, logging.Logger):
        logger.log(level, msg)
    elif isinstance(logger, str):
        logging.getLogger(logger).log(level, msg)
    else:
        raise TypeError(
            f"print_log: logger must be None, 'current', 'silent', a logging.Logger "
            f"or a logger name, not {type(logger).__name__}"
        )


# Long reports in full in the run's log file, short on the terminal.
#
# A run prints a few reports that are long by nature: the hook plan at the start (every hook, every
# mount point, every extension point) and the hook time table at the end (one row per hook and
# mount point). On a terminal they buried the training lines a user watches (issue 28: about 180
# of the digits example's 230 lines), yet a report read after the fact, or compared between runs,
# needs every row. So the log file (``work_dir/logs/run.log``) gets the full text and every other
# handler (the terminal, a handler the user added) a short one that names the file. A logger with
# no log file (a Runner without ``work_dir``'s file, a rank other than 0 that logs) gets the full
# text everywhere: nothing is lost.
def run_log_file(logger: logging.Logger) -> str | None:
    """The file the run's logger writes to (``work_dir/logs/run.log``), or None."""
    return next((h.baseFilename for h in _files(logger)), None)


def _files(logger: logging.Logger) -> list[logging.FileHandler]:
    return [h for h in logger.handlers if isinstance(h, logging.FileHandler)]


def log_brief_and_full(logger: logging.Logger, brief: str, full: str) -> None:
    """``full`` to the logger's log files and ``brief`` to its other handlers (INFO); ``full``
    to all of them when it writes no file."""
    files = _files(logger)
    if not files:
        logger.info(full)
        return
    log_info_line(logger, full, handlers=files)
    others = [h for h in logger.handlers if h not in files]
    if others:
        log_info_line(logger, brief, handlers=others, flush_now=True)


# -- secrets never leave the process --------------------------------------------------------------
class RedactingStream:
    """A text stream that masks secrets (:func:`redact_text`) in what is written to it and
    passes everything else (``isatty``, ``fileno``, ``flush``, ``buffer``) to the stream it
    wraps: ``sys.stdout``/``sys.stderr`` of ``drun`` and of every Ray worker, so that a line a
    library prints — an MLflow warning quoting its request URL, an uncaught exception — is
    masked too."""

    def __init__(self, stream: Any) -> None:
        self.wrapped = stream

    def write(self, text: str) -> int:
        self.wrapped.write(redact_text(text) if isinstance(text, str) else text)
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)


class RedactingFilter(logging.Filter):
    """On a handler: the record's message and exception text masked before any formatter
    sees them (a handler's own formatter, not the project's, writes the line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact_text(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return True


REDACTING_FILTER = RedactingFilter()


def redact_process_output() -> None:
    """Mask secrets wherever this process's lines leave it: ``sys.stdout`` and ``sys.stderr``
    wrapped in :class:`RedactingStream`, and every logging handler that exists now (the root
    logger's, a library's own) given :data:`REDACTING_FILTER`; handlers made later write
    through the wrapped streams, and the project's own formatter masks its lines itself. Called
    once per process, where it starts: ``drun``, a Ray worker, the validation process."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream))
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if REDACTING_FILTER not in handler.filters:
                handler.addFilter(REDACTING_FILTER)
