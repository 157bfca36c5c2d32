"""Hooks for the fault-tolerance tests (tests/unit/test_fault_tolerance.py), imported by the
replica processes through ``custom_imports``: one that kills its own replica at an iteration
(once per marker file), one that records what each replica process saw."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import tests.toy  # noqa: F401 - the toy models and data sets, registered in the replicas too
from hooks import HOOKS, Hook


def whole(runner) -> bool:
    """Whether this replica has committed a step with every slot in the quorum (so a failure
    now is one every replica of the run sees: the start-up's late joiner has joined)."""
    try:
        return runner.message_hub.get_scalar("train/replicas").current() == runner.replicas.replicas
    except KeyError:
        return False


@HOOKS.register_module(force=True)
class KillReplica(Hook):
    """SIGKILL this process in ``before_train_iter`` of the first iteration from ``at``
    (1-based) when it is rank ``rank`` of replica ``slot`` and the quorum has been whole, once:
    the marker file says it happened ("pid iteration")."""

    def __init__(self, slot: int, at: int, marker: str, rank: int = 0) -> None:
        self.slot, self.at, self.marker, self.rank = slot, at, Path(marker), rank

    def before_train_iter(self, runner, batch_idx=None, data_batch=None) -> None:
        mine = runner.replicas.slot == self.slot and runner.rank == self.rank
        if mine and runner.iter + 1 >= self.at and whole(runner):
            if not self.marker.exists():
                self.marker.write_text(f"{os.getpid()} {runner.iter + 1}")
                self.fail()

    def fail(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module(force=True)
class ReplicaDiary(Hook):
    """Appends one JSON line per event to ``path``: each committed iteration (pid, slot, iter),
    each quorum change, and the process's start (pid, iter after the heal)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def _write(self, **record) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"pid": os.getpid(), **record}) + "\n")

    def before_train(self, runner) -> None:
        self._write(kind="start", slot=runner.replicas.slot, iter=runner.iter)

    def after_train_iter(self, runner, batch_idx=None, data_batch=None, outputs=None) -> None:
        self._write(kind="iter", slot=runner.replicas.slot, iter=runner.iter)

    def after_replica_change(self, runner, event) -> None:
        self._write(kind=event.kind, slot=runner.replicas.slot, slots=list(event.slots),
                    iter=event.iteration, seconds=event.seconds)


@HOOKS.register_module(force=True)
class Pace(Hook):
    """Sleeps ``seconds`` after each iteration, so that a replacement (a new process: seconds to
    import torch) arrives while the run still has steps to go; once the file ``until`` exists
    (the failures a test makes are over), 5 ms."""

    def __init__(self, seconds: float, until: str | None = None) -> None:
        self.seconds, self.until = seconds, Path(until) if until else None

    def after_train_iter(self, runner, batch_idx=None, data_batch=None, outputs=None) -> None:
        over = self.until is not None and self.until.exists()
        time.sleep(0.005 if over else self.seconds)


@HOOKS.register_module(force=True)
class MarkWhenWhole(Hook):
    """Touches ``path`` when a replica joins after every file in ``markers`` exists (the kills
    a test makes have happened and the quorum is whole again)."""

    def __init__(self, markers: list[str], path: str) -> None:
        self.markers, self.path = [Path(m) for m in markers], Path(path)

    def after_replica_change(self, runner, event) -> None:
        if event.kind == "joined" and all(m.exists() for m in self.markers):
            self.path.touch()


@HOOKS.register_module(force=True)
class KillWhileHealing(Hook):
    """SIGKILLs a replacement of ``slot`` while it takes a peer's state (its
    ``after_load_checkpoint``, before anything of it is restored), once per marker file."""

    def __init__(self, slot: int, marker: str) -> None:
        self.slot, self.marker = slot, Path(marker)

    def after_load_checkpoint(self, runner, checkpoint) -> None:
        replacement = os.environ.get("DRUN_REPLACEMENT") == "1"
        if replacement and runner.replicas.slot == self.slot and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module(force=True)
class KillAfterRejoin(Hook):
    """SIGKILLs replica ``slot`` at the first iteration after it saw another replica lost and
    then joined again (so the quorum is whole when it dies), once per marker file."""

    def __init__(self, slot: int, marker: str) -> None:
        self.slot, self.marker = slot, Path(marker)
        self.lost = self.armed = False

    def after_replica_change(self, runner, event) -> None:
        self.lost = self.lost or event.kind == "lost"
        self.armed = self.armed or (self.lost and event.kind == "joined")

    def before_train_iter(self, runner, batch_idx=None, data_batch=None) -> None:
        if self.armed and runner.replicas.slot == self.slot and not self.marker.exists():
            self.marker.write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module(force=True)
class HangReplica(KillReplica):
    """:class:`KillReplica`'s moment and marker, but it sleeps (a hang that leaves the GIL free:
    a stuck read, a peer that never answers): its watchdog is what ends it."""

    def fail(self) -> None:
        time.sleep(3600)
