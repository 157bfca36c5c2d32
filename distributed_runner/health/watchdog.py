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

from distributed_runner.core.config import runs_in_process
from distributed_runner.core.errors import ConfigError, check_known_keys, did_you_mean
from distributed_runner.core.redact import redact_text
from distributed_runner.health.heartbeat import (
    DONE,
    HEARTBEAT,
    UNWATCHED,
    allowance,
    limit_of,
)

# ``watchdog=dict(...)``: how long a rank may make no progress before the run calls it hung,
# how long a collective may wait, and when a slow rank is named a straggler.
#
# The keys, their defaults and why:
#
# * ``hang_timeout`` (300 s): a rank whose loop has not moved (no new phase, no new iteration) for
#   this long is hung: its stacks are logged and the run fails over to a restart (Ray) or exits
#   non-zero (no Ray). Far below Ray's 600 s worker health check and the 1800 s process-group
#   default, far above any healthy iteration.
# * ``phase_timeouts``: phases that are slow by nature get their own allowance instead of
#   ``hang_timeout``: ``first_iter`` (a compiled model's first step, CUDA/cuDNN warm-up),
#   ``val`` (a whole validation), ``checkpoint`` (a save, synchronous or its async hand-off), and
#   ``data_warmup`` (the first batch: Ray Data's pipeline start, worker processes forking).
# * ``collective_timeout`` (600 s): the process group's timeout, after which a rank blocked in a
#   collective raises; longer than ``hang_timeout`` so that the watchdog, which names the hung rank
#   and shows its stacks, speaks first.
# * ``straggler_ratio`` (2.0) and ``straggler_patience`` (3): a rank whose time before entering the
#   step's collective is this many times the ranks' median, for this many logging windows in a
#   row, is named a straggler.
# * ``enabled`` (True): ``False`` turns the hang watch off (stragglers are still measured).
PHASE_TIMEOUT_DEFAULTS: dict[str, float] = {
    "first_iter": 1800.0,
    "val": 3600.0,
    "checkpoint": 1800.0,
    "data_warmup": 1800.0,
}


WATCHDOG_DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "hang_timeout": 300.0,
    "phase_timeouts": PHASE_TIMEOUT_DEFAULTS,
    "collective_timeout": 600.0,
    "straggler_ratio": 2.0,
    "straggler_patience": 3,
}


def _seconds(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(key, f"takes seconds (> 0), got {value!r}")
    return float(value)


def phase_timeouts(phases: Any) -> dict[str, float]:
    """``watchdog.phase_timeouts`` over PHASE_TIMEOUT_DEFAULTS, each checked.

    Args:
        first_iter (float): the first step's allowance (compilation, CUDA warm-up).
        val (float): a whole validation's allowance.
        checkpoint (float): a save's allowance (synchronous, or its asynchronous hand-off).
        data_warmup (float): the first batch's allowance (workers forking, Ray Data starting).
    """
    if not isinstance(phases, dict):
        raise ConfigError(
            "watchdog.phase_timeouts", f"takes dict(val=seconds, ...), got {phases!r}"
        )
    for name in phases:
        if name not in PHASE_TIMEOUT_DEFAULTS:
            raise ConfigError(
                f"watchdog.phase_timeouts.{name}",
                f"unknown phase{did_you_mean(name, PHASE_TIMEOUT_DEFAULTS)};"
                f" phases: {', '.join(PHASE_TIMEOUT_DEFAULTS)}",
            )
    return {
        name: _seconds(f"watchdog.phase_timeouts.{name}", phases.get(name, default))
        for name, default in PHASE_TIMEOUT_DEFAULTS.items()
    }


def parse_watchdog(spec: Any) -> dict[str, Any]:
    """The ``watchdog`` config with defaults filled in; ``None``/``True`` mean the defaults,
    ``False`` the defaults with ``enabled=False``. Every mistake is one line naming the key.

    Args:
        enabled (bool): False turns the hang watch off (stragglers are still measured).
        hang_timeout (float): seconds a rank may be silent before it is named hung.
        phase_timeouts (dict): longer allowances for slow phases, in seconds (below).
        collective_timeout (float): the process group's timeout, in seconds; longer than
            hang_timeout, so that the watch speaks first.
        straggler_ratio (float): a rank this many times slower than the median is a straggler.
        straggler_patience (int): logging windows in a row before a straggler is named.
    """
    if spec is None or spec is True:
        spec = {}
    elif spec is False:
        spec = {"enabled": False}
    if not isinstance(spec, dict):
        raise ConfigError(
            "watchdog", f"takes dict(hang_timeout=..., collective_timeout=...), got {spec!r}"
        )
    check_known_keys(spec, WATCHDOG_DEFAULTS, "watchdog")
    out = {**WATCHDOG_DEFAULTS, **spec}
    if not isinstance(out["enabled"], bool):
        raise ConfigError("watchdog.enabled", f"takes True or False, got {out['enabled']!r}")
    out["hang_timeout"] = _seconds("watchdog.hang_timeout", out["hang_timeout"])
    out["collective_timeout"] = _seconds("watchdog.collective_timeout", out["collective_timeout"])
    if out["collective_timeout"] <= out["hang_timeout"]:
        raise ConfigError(
            "watchdog.collective_timeout",
            f"must exceed watchdog.hang_timeout ({out['hang_timeout']:g} s), got "
            f"{out['collective_timeout']:g} s: the watchdog names the hung rank and shows its "
            f"stacks, the collective timeout only ends the wait",
        )
    out["phase_timeouts"] = phase_timeouts(spec.get("phase_timeouts", {}))
    ratio = out["straggler_ratio"]
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 1:
        raise ConfigError("watchdog.straggler_ratio", f"takes a number > 1, got {ratio!r}")
    out["straggler_ratio"] = float(ratio)
    patience = out["straggler_patience"]
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ConfigError(
            "watchdog.straggler_patience", f"takes a whole number >= 1, got {patience!r}"
        )
    return out


HANG_EXIT_CODE = 75


HANGS_DIR = "hangs"


@contextlib.contextmanager
def watched(runner: Any) -> Iterator[None]:
    """Around ``Runner.train()``: the heartbeat in phase ``setup`` with the run's settings (its
    collective timeouts follow the phases); without Ray, the watchdog thread too — only when the
    process's main thread trains: a Runner trained in a thread of a larger program (a tuning
    trial held between reports, a notebook) must not end that program."""
    settings = runner.settings.watchdog  # parsed once, with the config's other sections
    HEARTBEAT.begin(settings)
    thread = None
    if (
        settings["enabled"]
        and runs_in_process(runner.launcher)
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
            f"{limit:g} s, {allowance(phase, carry, self.settings)[1]}) in phase '{phase}' "
            f"at iteration {iteration}; every thread's stack follows (also in {path}); "
            f"exiting with {HANG_EXIT_CODE} so that what started this run restarts it "
            f"(--resume continues from the newest checkpoint)"
        )
        with open(path, "w") as f:
            f.write(block + "\n\n")
            f.flush()
            faulthandler.dump_traceback(f, all_threads=True)
        report = redact_text(path.read_text())  # faulthandler wrote the stacks: masked after
        path.write_text(report)
        stacks = report.split("\n\n", 1)[-1]
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
