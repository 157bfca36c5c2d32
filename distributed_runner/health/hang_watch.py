"""On Ray: the controller watches every rank's heartbeat and turns a hang into a restart.

Why on the controller: Ray's own health check runs on each worker actor's main thread, so a
training thread stuck in a dataloader, a file read or a collective still answers it, and a
stopped process is flagged only after 600 s, as a failure that with ``max_failures=0`` ends the
run. :class:`HangWatch` is a Ray Train V2 worker-group callback (``RunConfig(callbacks=...)``,
added by the launcher) that runs in the controller after every poll of the workers:

* it keeps at most one :func:`~.heartbeat.read_heartbeat` task in flight per rank (answered on
  the actor's main thread while the training thread is stuck) and never blocks on it;
* a rank whose heartbeat has not moved for its phase's allowance (:mod:`.heartbeat`) is hung —
  whether it answers and reports a stale heartbeat (a thread is stuck) or does not answer at all
  (the process is stopped, swapped out or holds the GIL: its last answer ages with the clock);
* then it names the culprit (the rank that does not answer, else one not waiting in a
  collective, else the fewest iterations), prints one block to the driver's terminal with that
  rank's threads (``py-spy dump``; Python's own view where py-spy cannot), writes every hung-
  looking rank's stacks to ``work_dir/hangs/<time>.txt``, kills the culprit's actor — a dead
  rank tears its process group down at once, where a stopped one makes Ray wait out its 30 s
  process-group shutdown — and raises :class:`RankHangError`, a ``WorkerGroupError``: Ray's
  failure policy restarts the group within ``launcher.max_failures`` and the workers resume
  exactly from the newest committed checkpoint (:mod:`distributed_runner.launch.ray_worker`).

Ray's callback API used here (``WorkerGroupCallback``, ``Worker.execute_async``) is a
DeveloperAPI of Ray 2.60, the version the project pins.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from time import monotonic
from typing import Any

import ray
from ray.train.v2.api.exceptions import WorkerGroupError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from distributed_runner.core.ray_private import WorkerGroupCallback
from distributed_runner.core.redact import redact_text
from distributed_runner.health.heartbeat import (
    IDLE,
    UNWATCHED,
    allowance,
    limit_of,
    own_stacks,
    read_heartbeat,
    stacks_by_py_spy,
)
from distributed_runner.health.watchdog import HANGS_DIR

# frames of a thread that waits for its peers: torch.distributed (a collective, DDP's set-up
# checking shapes across ranks), DDP's backward, Ray's report barrier
WAITING_MARKS = ("torch/distributed/", "_engine_run_backward", "train_fn_utils", "synchronization")
STACKS_WAIT_S = 15.0  # at most this long for the stacks before the group is failed anyway


class RankHangError(WorkerGroupError):
    """A rank made no progress for longer than the watchdog allows (retried like a crash)."""


@dataclass
class RankView:
    """What the controller knows of one rank's heartbeat."""

    rank: int
    worker: Any
    phase: str = IDLE
    carry: str | None = None
    iter: int = 0
    since: float = 0.0  # controller clock: when the rank last made progress
    pending: Any = None  # the heartbeat read in flight
    sent_at: float = 0.0  # when the last read was sent
    unanswered_since: float | None = None  # the oldest read still without an answer, sent then

    def stale(self, now: float) -> float:
        return now - self.since

    def silent(self, now: float) -> float:
        """Seconds since the oldest read still without an answer was sent (0 when answered): a
        read in flight, or one whose task failed, both count."""
        return now - self.unanswered_since if self.unanswered_since is not None else 0.0


@dataclass(frozen=True)
class Verdict:
    """Why a rank is called hung: its seconds without progress (or without an answer), the
    limit they passed and the config key that sets it."""

    seconds: float
    limit: float
    key: str
    mute: bool  # broken by silence in a slow phase (see HangWatch._verdict)


def _waits_for_peers(stack: str) -> bool:
    """The stack has a frame of :data:`WAITING_MARKS`: this rank waits for the others."""
    return any(mark in stack for mark in WAITING_MARKS)


def _where(view: RankView) -> str:
    """The rank's process and node, as a user looks for it on a multi-node cluster."""
    meta = view.worker.metadata
    return f"pid {meta.pid} on node {meta.node_ip} {meta.node_id[:8]}"


def _stacks_of_pid(pid: int) -> str:
    """A stopped or GIL-holding process cannot dump itself: py-spy reads it from outside."""
    return stacks_by_py_spy(pid) or f"(py-spy could not read process {pid}: no stack)"


class HangWatch(WorkerGroupCallback):
    """See the module docstring. ``settings``: the parsed ``watchdog`` config."""

    def __init__(self, settings: dict, work_dir: str) -> None:
        self.settings = settings
        self.work_dir = work_dir
        self.read_every = min(1.0, settings["hang_timeout"] / 5)
        self.views: list[RankView] = []

    # -- Ray's callback points -----------------------------------------------------------------
    def after_worker_group_start(self, worker_group: Any) -> None:
        now = monotonic()
        self.views = [
            # the first read goes out at the first poll: a rank stopped early is seen too
            RankView(w.distributed_context.world_rank, w, since=now, sent_at=now - self.read_every)
            for w in worker_group.get_workers()
        ]

    def before_worker_group_shutdown(self, worker_group: Any) -> None:
        self.views = []

    def after_worker_group_poll_status(self, worker_group_status: Any) -> None:
        if not self.views or worker_group_status.finished or worker_group_status.errors:
            return
        now = monotonic()
        for view in self.views:
            self._refresh(view, now)
        if any(self._verdict(v, now) is not None for v in self.views):
            self._fail(now)

    # -- reading -------------------------------------------------------------------------------
    def _limit(self, view: RankView) -> float:
        if view.phase in UNWATCHED:  # not training: only a process that stopped answering
            return self.settings["hang_timeout"]
        return limit_of(view.phase, view.carry, self.settings)

    def _idle(self, view: RankView, now: float) -> float:
        """Seconds without progress (training), or without an answer (not training)."""
        return view.silent(now) if view.phase in UNWATCHED else view.stale(now)

    def _silent(self, view: RankView, now: float) -> bool:
        """Its read has gone unanswered for two read intervals: the process cannot answer."""
        return view.silent(now) > 2 * self.read_every

    def _verdict(self, view: RankView, now: float) -> Verdict | None:
        """Whether ``view``'s rank is hung, and by which rule. Progress is bounded by its phase's
        allowance (a slow phase is slow work). Silence is bounded by ``hang_timeout`` in every
        phase: reads are answered on the worker actor's own thread, so a rank doing slow work —
        writing a checkpoint, validating, waiting in ``ray.train.report``'s barrier — still
        answers; one that answers none is stopped, swapped out or holds the GIL. (Before, a rank
        stopped inside a slow phase was given that phase's allowance, 30 to 60 minutes.)"""
        idle, limit = self._idle(view, now), self._limit(view)
        if idle > limit:
            key = allowance(view.phase, view.carry, self.settings)[1]
            if view.phase in UNWATCHED:
                key = "watchdog.hang_timeout"
            return Verdict(idle, limit, key, mute=False)
        hang = self.settings["hang_timeout"]
        if view.silent(now) > hang:
            return Verdict(view.silent(now), hang, "watchdog.hang_timeout", mute=True)
        return None

    def _refresh(self, view: RankView, now: float) -> None:
        if view.pending is not None:
            ready, _ = ray.wait([view.pending], timeout=0)
            if not ready:
                return
            ref, view.pending = view.pending, None
            try:
                beat = ray.get(ref)
            except Exception:  # noqa: BLE001 - the read task died: unanswered, silence counts
                beat = None
            if beat is not None:
                view.phase, view.carry, view.iter = beat["phase"], beat["carry"], beat["iter"]
                view.since = now - beat["age"]
                view.unanswered_since = None
        if now - view.sent_at >= self.read_every:
            view.sent_at = now
            if view.unanswered_since is None:
                view.unanswered_since = now
            try:
                view.pending = view.worker.execute_async(read_heartbeat)
            except Exception:  # noqa: BLE001 - not sent: the rank stays unanswered
                view.pending = None

    # -- acting --------------------------------------------------------------------------------
    def _fail(self, now: float) -> None:
        """Report the hang (:meth:`_report`), kill the culprit (and any rank that stopped
        answering) and raise. If the report itself fails — a stack read, the file, a bug — one
        line says so and the most overdue rank is killed all the same: a hang the watch has seen
        always ends in a restart, never in silence."""
        try:
            block, culprit, suspects = self._report(now)
        except Exception as e:  # noqa: BLE001 - whatever broke the report, the restart goes on
            culprit = self._most_overdue(now)
            suspects = [culprit]
            block = (
                f"drun hang watch: rank {culprit.rank} hung (phase '{culprit.phase}', iteration "
                f"{culprit.iter}) and the report of it failed ({type(e).__name__}: {e}); its "
                "worker is killed and the group restarts within launcher.max_failures"
            )
            print(block, file=sys.stderr)
            sys.stderr.flush()
        for view in suspects:  # a stopped rank would hold up Ray's process-group shutdown 30 s
            if view is culprit or self._silent(view, now):
                with contextlib.suppress(Exception):  # already gone: nothing to kill
                    ray.kill(view.worker.actor)
        raise RankHangError(block, worker_failures={})

    def _report(self, now: float) -> tuple[str, RankView, list[RankView]]:
        """Stacks, the culprit, the block on the driver's terminal and the file under
        ``work_dir/hangs``; returns the block, the culprit and the suspects."""
        suspects = [v for v in self.views if self._suspect(v, now)]
        stacks = self._stacks(suspects, now)
        culprit = self._culprit(suspects, stacks, now)
        suspects.sort(key=lambda v: v is not culprit)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(self.work_dir) / HANGS_DIR / f"{stamp}-rank{culprit.rank}.txt"
        block = self._block(culprit, suspects, stacks, path, now)
        body = "\n\n".join(
            f"== rank {v.rank} == ({_where(v)}; {self._read_how(v, now)})\n{stacks[v.rank]}"
            for v in suspects
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(redact_text(f"{block}\n\n{body}\n"))
        except OSError as e:  # the controller may run where work_dir is not writable
            block += f"\n  (could not write {path}: {e})"
        text = f"{block}\nrank {culprit.rank}'s threads:\n{stacks[culprit.rank]}"
        print(redact_text(text), file=sys.stderr)
        sys.stderr.flush()
        return block, culprit, suspects

    def _suspect(self, view: RankView, now: float) -> bool:
        """Half way to a verdict: its stacks go into the report."""
        hang = self.settings["hang_timeout"]
        return self._idle(view, now) > 0.5 * self._limit(view) or view.silent(now) > 0.5 * hang

    def _most_overdue(self, now: float) -> RankView:
        """The rank with a verdict that has been silent longest, else idle longest."""
        return max(
            self.views,
            key=lambda v: (self._verdict(v, now) is not None, v.silent(now), self._idle(v, now)),
        )

    def _stacks(self, suspects: list[RankView], now: float) -> dict[int, str]:
        """Every suspect's threads, gathered in parallel: a rank that answers dumps itself, one
        that does not is read by py-spy from a task on its node."""
        refs: dict[int, Any] = {}
        out: dict[int, str] = {}
        here = ray.get_runtime_context().get_node_id()
        for view in suspects:
            meta = view.worker.metadata
            if self._silent(view, now) and meta.node_id == here:
                out[view.rank] = _stacks_of_pid(meta.pid)  # py-spy from here: no task to start
            elif self._silent(view, now):
                task = ray.remote(num_cpus=0, max_retries=0)(_stacks_of_pid)
                strategy = NodeAffinitySchedulingStrategy(meta.node_id, soft=False)
                refs[view.rank] = task.options(scheduling_strategy=strategy).remote(meta.pid)
            else:
                refs[view.rank] = view.worker.execute_async(own_stacks)
        if refs:
            ray.wait(list(refs.values()), num_returns=len(refs), timeout=STACKS_WAIT_S)
        for rank, ref in refs.items():
            try:
                out[rank] = ray.get(ref, timeout=0)
            except Exception as e:  # noqa: BLE001 - a missing stack must not hide the hang
                out[rank] = f"(no stack: {type(e).__name__}: {e})"
        return out

    def _read_how(self, view: RankView, now: float) -> str:
        """How :meth:`_stacks` got the rank's threads (what the report's reader can trust)."""
        if not self._silent(view, now):
            return "stacks dumped by the worker itself"
        here = ray.get_runtime_context().get_node_id()
        where = "the controller's node" if view.worker.metadata.node_id == here else "its node"
        return f"stacks read by py-spy on {where}"

    def _culprit(self, suspects: list[RankView], stacks: dict[int, str], now: float) -> RankView:
        return min(
            suspects,
            key=lambda v: (
                not self._silent(v, now),
                _waits_for_peers(stacks.get(v.rank, "")),
                v.iter,
                -self._idle(v, now),
            ),
        )

    def _tripped(self, culprit: RankView, now: float) -> tuple[RankView, Verdict]:
        """The rank whose verdict the report gives, and the verdict: the culprit's own, else
        the most overdue rank's (:meth:`_most_overdue`). A rank waiting in a collective for the
        hung one often passes its limit first (it stopped making progress earlier); the
        report then says so instead of quoting the culprit's figure against a limit it has
        not reached yet."""
        for view in (culprit, self._most_overdue(now)):
            verdict = self._verdict(view, now)
            if verdict is not None:
                return view, verdict
        key = allowance(culprit.phase, culprit.carry, self.settings)[1]
        return culprit, Verdict(self._idle(culprit, now), self._limit(culprit), key, mute=False)

    def _first_line(self, culprit: RankView, now: float) -> str:
        """Who hung, the limit passed (and by which rank, when a peer passed it first), the
        phase and iteration, and how the watch knows."""
        tripped, verdict = self._tripped(culprit, now)
        if verdict.mute and tripped is culprit:
            how = (
                "the process is stopped, swapped out or holds the GIL (a slow phase allows slow "
                "work, which still answers, not silence)"
            )
        elif self._silent(culprit, now):
            how = (
                f"it has not answered a heartbeat read for {culprit.silent(now):.1f} s: the "
                "process is stopped, swapped out or holds the GIL"
            )
        else:
            how = "it answers heartbeat reads, so a thread of it is stuck (its stack is below)"
        what = "no answer to a heartbeat read" if verdict.mute else "no progress"
        passed = f"{what} for {verdict.seconds:.1f} s (limit {verdict.limit:g} s, {verdict.key})"
        if tripped is not culprit:
            passed = (
                f"no progress for {self._idle(culprit, now):.1f} s; rank {tripped.rank} passed "
                f"its limit first: {passed}"
            )
        return (
            f"drun hang watch: rank {culprit.rank} hung: {passed} in phase '{culprit.phase}' "
            f"at iteration {culprit.iter}; {how}"
        )

    def _block(
        self,
        culprit: RankView,
        suspects: list[RankView],
        stacks: dict[int, str],
        path: Path,
        now: float,
    ) -> str:
        lines = [self._first_line(culprit, now)]
        for view in suspects:
            if view is not culprit:
                waiting = _waits_for_peers(stacks.get(view.rank, ""))
                lines.append(
                    f"  rank {view.rank}: phase '{view.phase}', iteration {view.iter}, no "
                    f"progress for {self._idle(view, now):.1f} s"
                    f"{', waiting for its peers' if waiting else ''}"
                )
        lines.append(f"  every hung rank's stacks: {path}")
        lines.append(
            f"  rank {culprit.rank}'s worker ({_where(culprit)}) is killed; the group restarts "
            "within launcher.max_failures and resumes from the newest checkpoint"
        )
        return "\n".join(lines)


def hang_watch_callbacks(settings: dict, work_dir: str) -> list[Any]:
    """The callbacks the Ray launcher adds to ``RunConfig`` for ``settings``."""
    return [HangWatch(settings, work_dir)] if settings["enabled"] else []
