"""The run's Python logger: rank 0 speaks at INFO, other ranks only warn.

Every message also goes to ``work_dir/logs/run.log`` (rank 0) so a cluster run's log survives the
terminal it was printed on.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

LOGGER_NAME = "distributed_runner"
_MARK = "_distributed_runner_handler"


class _SecondsFormatter(logging.Formatter):
    """Timestamps to the second, formatted once per second: the terminal and the log file share
    this formatter, and a training line is written every few iterations."""

    _second = -1
    _text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._second, self._text = second, super().formatTime(record, datefmt)
        return self._text


def setup_logger(work_dir: Path | None, rank: int, level: str | int = "INFO") -> logging.Logger:
    """(Re)configure the project logger for this process; returns it."""
    logger = logging.getLogger(LOGGER_NAME)
    for h in list(logger.handlers):
        if getattr(h, _MARK, False):
            logger.removeHandler(h)
            h.close()
    logger.setLevel(level if rank == 0 else logging.WARNING)
    logger.propagate = False
    fmt = _SecondsFormatter(
        "%(asctime)s %(levelname)s " + (f"[rank {rank}] " if rank else "") + "%(message)s",
        datefmt="%m/%d %H:%M:%S")
    stream = logging.StreamHandler(sys.stdout)
    stream.setFormatter(fmt)
    setattr(stream, _MARK, True)
    logger.addHandler(stream)
    if work_dir is not None and rank == 0:
        (work_dir / "logs").mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(work_dir / "logs" / "run.log")
        file_handler.setFormatter(fmt)
        setattr(file_handler, _MARK, True)
        logger.addHandler(file_handler)
    return logger
