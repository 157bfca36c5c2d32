"""Hang watch for one training process: the heartbeat's settings while ``train()`` runs and,
without Ray, a watchdog thread that ends a hung process.

Why the process ends itself: without Ray nothing outside sees the loop (a plain run, or one rank
of ``torchrun``), and a hung process holds its GPU, its node and every peer waiting in a
collective until the 30-minute default collective timeout, or forever. After ``hang_timeout``
(or the phase's allowance, :mod:`.heartbeat`) without progress, the thread writes every thread's
stack (``faulthandler``: it needs nothing of the hung thread, not even its locks) to
``work_dir/hangs/rank<r>-<time>.txt`` and to stderr, adds them to the run log, and exits the
process with :data:`HANG_EXIT_CODE` — what started the run (``torchrun --max-restarts``, a Slurm
requeue, a Kubernetes restart policy) restarts it, and ``--resume`` continues from the newest
checkpoint.

A thread that holds the GIL and never lets it go (a C extension stuck without releasing it)
stops this thread too, so it also keeps ``faulthandler``'s own timer armed, re-arming it every
half limit: that timer needs no GIL, and if this thread has not re-armed it for 1.5 x the current
phase's limit it prints "Timeout" and every thread's stack to stderr and exits with status 1
(faulthandler's own; it cannot give :data:`HANG_EXIT_CODE`). A hang that leaves the GIL free is
this thread's, at the limit, as above.

On Ray this thread is not started: the controller watches every rank (:mod:`.hang_watch`), which
sees a stopped process too and restarts the group itself. The hot loop pays only the heartbeat.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from time import monotonic
from typing import Any

from .heartbeat import DONE, HEARTBEAT, SLOW_PHASES, UNWATCHED, limit_of
from .launcher_config import normalize_launcher
from .watchdog_config import parse_watchdog

# EX_TEMPFAIL (sysexits.h): "a temporary failure; retry later" — distinct from an error (1), a
# preemption (143) and coreutils timeout's 124
HANG_EXIT_CODE = 75
HANGS_DIR = "hangs"


def limit_name(phase: str, carry: str | None) -> str:
    """The config key whose seconds bound ``phase`` (for the message)."""
    for name in (phase, carry):
        if name in SLOW_PHASES:
            return f"watchdog.phase_timeouts.{SLOW_PHASES[name]}"
    return "watchdog.hang_timeout"


@contextlib.contextmanager
def watched(runner: Any) -> Iterator[None]:
    """Around ``Runner.train()``: the heartbeat in phase ``setup`` with the run's settings (its
    collective timeouts follow the phases); without Ray, the watchdog thread too — only when the
    process's main thread trains: a Runner trained in a thread of a larger program (a tuning
    trial held between reports, a notebook) must not end that program."""
    settings = parse_watchdog(runner.cfg.get("watchdog"))
    HEARTBEAT.begin(settings)
    thread = None
    if (
        settings["enabled"]
        and normalize_launcher(runner.launcher) is None
        and threading.current_thread() is threading.main_thread()
    ):
        thread = Watchdog(settings, runner.logger, runner.work_dir, runner.rank)
        thread.start()
    try:
        yield
    finally:
        if thread is not None:
            thread.stop()
        HEARTBEAT.mark(DONE)
        HEARTBEAT.settings = None


class Watchdog(threading.Thread):
    """Checks the heartbeat every ``min(1 s, hang_timeout / 10)``; ends the process on a hang."""

    def __init__(self, settings: dict, logger: Any, work_dir: Path, rank: int) -> None:
        super().__init__(name="drun-watchdog", daemon=True)
        self.settings, self.logger, self.work_dir, self.rank = settings, logger, work_dir, rank
        self._stopped = threading.Event()
        self._armed: tuple[float, float] | None = None  # (when, limit) of faulthandler's timer
        self._arming = threading.Lock()  # a stop never races a re-arm: after it, none

    def stop(self) -> None:
        with self._arming:
            self._stopped.set()
            self._disarm()

    def run(self) -> None:
        interval = min(1.0, self.settings["hang_timeout"] / 10)
        while True:
            beat = HEARTBEAT
            phase, carry, since = beat.phase, beat.carry, beat.t
            if phase in UNWATCHED:
                with self._arming:
                    self._disarm()
            else:
                age = monotonic() - since
                limit = limit_of(phase, carry, self.settings)
                if age > limit and not self._stopped.is_set():
                    self.end_process(phase, carry, beat.iter, age, limit)
                self._keep_armed(limit)  # from the start: a GIL held early is caught too
            if self._stopped.wait(interval):
                return

    def _keep_armed(self, limit: float) -> None:
        """faulthandler's timer (module docstring): fires 1.5 x ``limit`` after its last arming,
        re-armed every ``limit / 2`` and whenever the phase's limit changes."""
        now = monotonic()
        if self._armed is not None:
            when, armed_for = self._armed
            if armed_for == limit and now - when < limit / 2:
                return
        with self._arming:
            if self._stopped.is_set():
                return
            with contextlib.suppress(OSError, ValueError, RuntimeError):  # stderr closed
                faulthandler.dump_traceback_later(1.5 * limit, exit=True, file=sys.stderr)
                self._armed = (now, limit)

    def _disarm(self) -> None:
        """Cancel faulthandler's timer (with ``_arming`` held)."""
        if self._armed is not None:
            faulthandler.cancel_dump_traceback_later()
            self._armed = None

    def end_process(
        self, phase: str, carry: str | None, iteration: int, age: float, limit: float
    ) -> None:
        """Stacks to a file and stderr, the block to the log, then ``os._exit``."""
        with self._arming:  # this exit is the watchdog's, not faulthandler's timer's
            self._disarm()
        folder = Path(self.work_dir) / HANGS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{self.rank}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
        block = (
            f"drun watchdog: rank {self.rank} hung: no progress for {age:.1f} s (limit "
            f"{limit:g} s, {limit_name(phase, carry)}) in phase '{phase}' at iteration "
            f"{iteration}; every thread's stack follows (also in {path}); exiting with "
            f"{HANG_EXIT_CODE} so that what started this run restarts it (--resume continues "
            f"from the newest checkpoint)"
        )
        with open(path, "w") as f:
            f.write(block + "\n\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        stacks = path.read_text().split("\n\n", 1)[-1]
        with contextlib.suppress(OSError):
            os.write(sys.stderr.fileno(), f"{block}\n{stacks}".encode())
        # the hung thread may hold the logging lock: log from a thread of its own, briefly
        logged = threading.Thread(target=self._log, args=(f"{block}\n{stacks}",), daemon=True)
        logged.start()
        logged.join(5.0)
        os._exit(HANG_EXIT_CODE)

    def _log(self, text: str) -> None:
        """To the run log only (stderr already has it)."""
        record = self.logger.makeRecord(
            self.logger.name, logging.ERROR, __file__, 0, text, None, None
        )
        for handler in self.logger.handlers:
            if hasattr(handler, "baseFilename"):
                handler.handle(record)
                handler.flush()
