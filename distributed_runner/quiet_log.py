"""Long reports in full in the run's log file, short on the terminal.

A run prints a few reports that are long by nature: the hook plan at the start (every hook, every
mount point, every extension point) and the hook time table at the end (one row per hook and
mount point). On a terminal they buried the training lines a user watches (issue 28: about 180
of the digits example's 230 lines), yet a report read after the fact, or compared between runs,
needs every row. So the log file (``work_dir/logs/run.log``) gets the full text and every other
handler (the terminal, a handler the user added) a short one that names the file. A logger with
no log file (a Runner without ``work_dir``'s file, a rank other than 0 that logs) gets the full
text everywhere: nothing is lost.
"""

from __future__ import annotations

import logging

from .log import log_info_line


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
