"""Each rank's heartbeat: which phase its loop is in, at which iteration, since when.

Why a module-level object written by the loop itself: something *outside* the training thread
must be able to tell a hung rank from a busy one — the Ray controller's :mod:`.hang_watch`
(which reads it through a Ray task on the worker actor's own thread, so a stuck training thread
does not stop the read) and, without Ray, the watchdog thread of :mod:`.watchdog`. Writing it
costs two attribute stores and a ``time.monotonic()`` call at the points the loop already passes
(about 0.2 µs per iteration, see the README's figures), with no hook dispatch and no lock: a
reader sees either the old or the new value of each field, which is all a timeout needs.

Phases and the allowance that bounds each (``watchdog.hang_timeout`` unless the phase is slow by
nature and has a ``watchdog.phase_timeouts`` entry):

========== ================================================================= ===============
phase      what the rank is doing                                            allowance
========== ================================================================= ===============
idle       building the Runner, or not training: never watched               —
setup      ``train()`` began: before_run, loading the resumed checkpoint ...  first_iter
data_warmup the first batch of a data pass (workers fork, Ray Data starts)   data_warmup
first_iter the first iteration of this process (compilation, warm-up)        first_iter
step       an iteration: before_train_iter, the step, after_train_iter       hang_timeout
data       between iterations: the next batch, requests, epoch ends          hang_timeout
val        a whole validation                                                val
checkpoint a save or its commit (RayReportHook's report included)            checkpoint
teardown   after the loop: after_train, after_run, the last commit            checkpoint
peers      a replica waits for its quorum or its sum (fault_tolerance)      2 x hang_timeout
done       ``train()`` returned or raised: never watched                     —
========== ================================================================= ===============

Until its next iteration completes, a rank keeps the largest allowance of the slow phases it went
through since its last one (``carry``): its peers may still be in them (rank 0 writing the
checkpoint) and it waits for them in the next collective, which is not a hang. Never a false
alarm comes before a tight bound: a validation right after a save is bounded by the larger of
the two allowances. A replica of a fault-tolerant run waiting for its peers (``peers``) is allowed
twice ``hang_timeout``: the peer that hung is judged by its own watchdog first, is evicted and
replaced, and the waiting replica goes on without it.

While a slow phase (or its carry) lasts, the process group's timeout is widened by the same
amount (``collective_timeout + allowance - hang_timeout``) and narrowed again afterwards, so the
collective timeout never ends a phase the watchdog still allows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import traceback
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from time import monotonic
from typing import Any

IDLE, SETUP, DATA_WARMUP, FIRST_ITER = "idle", "setup", "data_warmup", "first_iter"
STEP, DATA, VAL, CHECKPOINT, TEARDOWN, DONE = (
    "step",
    "data",
    "val",
    "checkpoint",
    "teardown",
    "done",
)
PEERS = "peers"
UNWATCHED = (IDLE, DONE)
# phase -> its watchdog.phase_timeouts key (phases not listed use hang_timeout)
SLOW_PHASES = {
    SETUP: "first_iter",
    DATA_WARMUP: "data_warmup",
    FIRST_ITER: "first_iter",
    VAL: "val",
    CHECKPOINT: "checkpoint",
    TEARDOWN: "checkpoint",
}


def allowance(phase: str, carry: str | None, settings: dict) -> tuple[float, str]:
    """Seconds without progress a rank in ``phase`` (still carrying ``carry``) is allowed, and
    the config key that sets them — the one slow-phase rule the watchdog, the hang watch and
    their messages share: the largest of ``watchdog.hang_timeout`` and the
    ``watchdog.phase_timeouts`` entry of ``phase`` or ``carry`` when either is a slow phase."""
    limit, key = settings["hang_timeout"], "watchdog.hang_timeout"
    if phase == PEERS:  # the hung peer's own watchdog speaks first (module docstring)
        limit, key = 2 * limit, "2 x watchdog.hang_timeout, waiting for its replica peers"
    for name in (phase, carry):
        if name in SLOW_PHASES:
            seconds = settings["phase_timeouts"][SLOW_PHASES[name]]
            if seconds >= limit:
                limit, key = seconds, f"watchdog.phase_timeouts.{SLOW_PHASES[name]}"
    return limit, key


def limit_of(phase: str, carry: str | None, settings: dict) -> float:
    """The seconds of :func:`allowance`."""
    return allowance(phase, carry, settings)[0]


class Heartbeat:
    """One per process (:data:`HEARTBEAT`); the loop writes it, watchers read it."""

    __slots__ = ("_pg_timeout", "carry", "iter", "phase", "settings", "step_phase", "t")

    def __init__(self) -> None:
        self.settings: dict | None = None  # the watchdog config while a run is watched
        self._pg_timeout: float | None = None
        self.reset(IDLE)

    def reset(self, phase: str) -> None:
        self.phase, self.iter, self.t = phase, 0, monotonic()
        self.step_phase: str = FIRST_ITER
        self.carry: str | None = None

    def begin(self, settings: dict) -> None:
        """A watched run starts (``settings``: its parsed ``watchdog``): phase ``setup``, with
        the first iteration's allowance, until its first step."""
        self.settings = settings
        self.reset(SETUP)
        self.mark(SETUP)

    def mark(self, phase: str) -> None:
        """Enter ``phase`` now (not on the per-iteration path: it may adjust the group timeout)."""
        self.phase, self.t = phase, monotonic()
        if phase in SLOW_PHASES and (
            self.carry is None
            or self.settings is None
            or limit_of(phase, None, self.settings) >= limit_of(self.carry, None, self.settings)
        ):
            self.carry = phase  # the largest allowance met since the last iteration
        self._fit_group_timeout()

    def stepping(self) -> None:
        """The loop starts an iteration (hot path)."""
        self.phase, self.t = self.step_phase, monotonic()

    def stepped(self, iteration: int) -> None:
        """The loop finished iteration ``iteration`` (hot path)."""
        self.iter, self.phase, self.t = iteration, DATA, monotonic()
        if self.carry is not None or self.step_phase is not STEP:  # after a slow phase
            self.end_carry()

    def end_carry(self) -> None:
        """The first iteration after a slow phase completed: back to ``hang_timeout``."""
        self.carry, self.step_phase = None, STEP
        self._fit_group_timeout()

    @contextlib.contextmanager
    def slow(self, phase: str) -> Iterator[None]:
        """``phase`` for the duration of the block, then the phase that was before it."""
        before = self.phase
        self.mark(phase)
        try:
            yield
        finally:
            self.phase, self.t = before, monotonic()
            self._fit_group_timeout()

    @contextlib.contextmanager
    def peers(self) -> Iterator[None]:
        """A replica waiting for its quorum or its sum (:data:`PEERS`), then back in the phase
        it was in, counted from now (hot path: no group timeout to adjust, replicas have none)."""
        before = self.phase
        self.phase, self.t = PEERS, monotonic()
        try:
            yield
        finally:
            self.phase, self.t = before, monotonic()

    def read(self) -> dict[str, Any]:
        """What a watcher needs; ``age``: seconds since the rank last made progress."""
        return {
            "phase": self.phase,
            "carry": self.carry,
            "iter": self.iter,
            "age": monotonic() - self.t,
            "pid": os.getpid(),
        }

    def _fit_group_timeout(self) -> None:
        """Widen the process group's timeout for a slow phase (or its carry), narrow it after."""
        settings = self.settings
        if settings is None:
            return
        limit = limit_of(self.phase, self.carry, settings)
        wanted = settings["collective_timeout"] + limit - settings["hang_timeout"]
        if wanted != self._pg_timeout:
            set_group_timeout(wanted)
            self._pg_timeout = wanted


HEARTBEAT = Heartbeat()


def read_heartbeat() -> dict[str, Any]:
    """:data:`HEARTBEAT` as a dict (what the Ray controller's watcher runs on each worker)."""
    return HEARTBEAT.read()


def set_group_timeout(seconds: float) -> None:
    """The default process group's collective timeout, if there is a group (torchtitan does the
    same after start-up; the API is private, so a torch without it just keeps its timeout)."""
    import torch.distributed as torch_dist

    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return
    setter = getattr(torch_dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is not None:
        setter(timedelta(seconds=seconds))


def py_spy() -> str | None:
    """The py-spy executable (ships with ``ray[default]``), beside this Python or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")


def stacks_by_py_spy(pid: int, timeout: float = 10.0) -> str | None:
    """Every thread's Python stack of process ``pid`` through ``py-spy dump --nonblocking``
    (which reads a stopped process too, without pausing a running one); None if it cannot."""
    exe = py_spy()
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "dump", "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 and out.stdout.strip() else None


def own_stacks() -> str:
    """Every thread's stack of this process: py-spy's, else Python's own view
    (``sys._current_frames``, what ``faulthandler`` prints)."""
    text = stacks_by_py_spy(os.getpid())
    if text is not None:
        return text
    import threading

    names = {t.ident: t.name for t in threading.enumerate()}
    parts = [f"(py-spy unavailable: Python's own view) process {os.getpid()}"]
    for ident, frame in sys._current_frames().items():
        parts.append(f'\nThread {ident} "{names.get(ident, "?")}":')
        parts.append("".join(traceback.format_stack(frame)).rstrip())
    return "\n".join(parts)
