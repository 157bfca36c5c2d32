"""The launcher of a fault-tolerant run: a lighthouse, one process a replica, replacements.

``drun train cfg.py`` with ``fault_tolerance=dict(mode='replicas', replicas=N, ...)`` and
``launcher='none'`` comes here: this process runs torchft's lighthouse and starts the ``N``
replica processes (slot ``s`` in ``DRUN_REPLICA``). When one dies, the others go on with the
quorum they have (distributed_runner/fault_tolerance) and this process starts a replacement for
its slot, which heals from a live peer: no other process restarts and no checkpoint is loaded.
On Ray the same launcher runs on the driver with Ray actors for processes
(launch/ray_replicas.py: ``spawner``).

A replica that hangs is ended by its own watchdog (health/watchdog.py: exit 75) and replaced as
a killed one is; the replicas waiting for it try each step again until it is gone (the driver
keeps their waits below ``watchdog.hang_timeout``, so only the hung one is called hung).

When too few remain to commit a step (fewer than ``min_replicas`` alive) or the replacements are
used up, it falls back to the restart every run has: all replicas stopped and started again
from the newest checkpoint (``resume=True``), with one line saying why.

Replica 0 writes the run's folder (logs, checkpoints, sinks); replica ``s`` writes its own under
``work_dir/replicas/<s>``: they hold the same weights, and a run is one folder. A replica killed
by a signal (SIGKILL, the OOM killer, a lost machine) is replaced; one that raised (its log says
why) ends the run with its exit status: a replacement would raise again.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from distributed_runner.checkpoint.files import read_pointer
from distributed_runner.checkpoint.resume_choice import choose_run
from distributed_runner.core.config import to_plain
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.run_folders import run_dir
from distributed_runner.engine.sections import settings_of
from distributed_runner.fault_tolerance.options import parse_fault_tolerance, torchft_missing
from distributed_runner.fault_tolerance.replica import (
    LIGHTHOUSE_ENV,
    NO_PEER_EXIT,
    REPLACEMENT_ENV,
    SLOT_ENV,
    NoLivePeer,
    join_rank_group,
)
from distributed_runner.health.watchdog import HANG_EXIT_CODE, HANGS_DIR

logger = logging.getLogger("distributed_runner.replicas")
POLL_S = 0.05


def replica_config(cfg: dict, slot: int, run_name: str, resume: Any) -> dict:
    """What replica ``slot`` builds: the run's config, its own folder unless it is slot 0."""
    out = dict(cfg, run_name=run_name, resume=bool(resume) and resume)
    if slot:  # replica 0's log is the run's: the others' say only warnings
        out["log_level"] = "WARNING"
        out["work_dir"] = str(Path(cfg["work_dir"]).expanduser().resolve() / "replicas" / str(slot))
    return out


def replica_main(cfg_file: str) -> None:
    """A replica process (``python -m distributed_runner.launch.replicas FILE``): the config
    the launcher wrote, its slot and the lighthouse in the environment, then training."""
    from distributed_runner.engine.runner import Runner

    with open(cfg_file, "rb") as f:
        cfg = pickle.load(f)
    join_rank_group()
    try:
        Runner.from_cfg(cfg).train()
    except NoLivePeer as error:  # the launcher falls back to a restart
        print(error, file=sys.stderr)
        sys.exit(NO_PEER_EXIT)


class LocalProcesses:
    """Replicas as child processes of this one, on this machine (``launcher='none'``): one
    process a replica, or a :class:`RankGroup` of ``ranks`` processes."""

    where = "local processes"

    def __init__(self, replicas: int, ranks: int = 1) -> None:
        self.replicas, self.ranks = replicas, ranks
        self._files = tempfile.TemporaryDirectory(prefix="drun-replicas-")
        self._count = 0

    def host(self) -> str:
        """Where the replicas reach the lighthouse this process runs."""
        return "localhost"

    def spawn(self, slot: int, cfg: dict, env: dict[str, str]) -> Any:
        """Replica ``slot``'s processes (a ``subprocess.Popen``, or a group of them with its
        surface: poll, kill, wait, pid)."""
        self._count += 1
        cfg_file = Path(self._files.name) / f"replica_{slot}_{self._count}.pkl"
        cfg_file.write_bytes(pickle.dumps(cfg))
        env = {**os.environ, **env}
        # the machine's cores shared out, as torchrun and Ray do (else each replica's torch takes
        # them all and the replicas slow each other down); the user's setting wins
        share = (os.cpu_count() or 1) // (self.replicas * self.ranks)
        env.setdefault("OMP_NUM_THREADS", str(max(1, share)))
        # the modules this process imports from (the user's folder, custom_imports) stay importable
        paths = [p for p in sys.path if p and Path(p).is_dir()]
        env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        command = [sys.executable, "-m", "distributed_runner.launch.replicas", str(cfg_file)]
        if self.ranks == 1:
            return subprocess.Popen(command, env=env)
        # the group's own process group, as torchrun would start it (its rank 0 binds the port)
        env.update(MASTER_ADDR="localhost", MASTER_PORT=str(free_port()))
        env["WORLD_SIZE"] = str(self.ranks)
        return RankGroup(
            [
                subprocess.Popen(command, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)})
                for r in range(self.ranks)
            ]
        )

    def describe(self, code: int) -> str:
        return f"exit {code}"

    def close(self) -> None:
        self._files.cleanup()


def _cause_first(code: int) -> int:
    """Orders a group's exit statuses so that the cause comes first: a rank killed by a signal,
    then the watchdog's and the no-peer verdicts, then an error (which a lost peer's broken
    collective raises in the ranks left)."""
    if code < 0:
        return 0
    return 1 if code in (HANG_EXIT_CODE, NO_PEER_EXIT) else 2


def free_port(host: str = "localhost") -> int:
    """A port nothing listens on now, for a group's rendezvous (its rank 0 binds it)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class RankGroup:
    """The ranks of one replica group (processes, or Ray actors, with a ``subprocess.Popen``'s
    poll, kill, wait and pid), seen as one: it has ended when one rank died or all finished,
    and the rest of a group that lost a rank are killed (FSDP's collectives would wait for the
    lost one: the group is replaced whole)."""

    def __init__(self, ranks: list[Any]) -> None:
        self.ranks = ranks
        self.pid = ranks[0].pid
        self.returncode: int | None = None
        self.error = None  # a rank's exception (a Ray actor's), when the group failed on it

    def poll(self) -> int | None:
        """None while every rank runs, or some finished and the others still do; else the
        exit status of the rank that failed first (its group killed), or 0."""
        if self.returncode is not None:
            return self.returncode
        codes = [r.poll() for r in self.ranks]
        failed = [(c, r) for c, r in zip(codes, self.ranks, strict=True) if c not in (None, 0)]
        if failed:  # a rank killed by a signal, or evicted, first: the others' errors follow
            self.kill()
            self.returncode, cause = min(failed, key=lambda pair: _cause_first(pair[0]))
            self.error = getattr(cause, "error", None)
        elif all(c == 0 for c in codes):
            self.returncode = 0
        return self.returncode

    def kill(self) -> None:
        for rank in self.ranks:  # every one: a Ray actor outlives a task that raised
            rank.kill()

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        for rank in self.ranks:
            rank.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        code = self.poll()
        return 0 if code is None else code


class ReplicaLauncher:
    """Starts the replicas and keeps their slots filled (module docstring); ``spawner`` starts
    each replica (:class:`LocalProcesses`, or Ray actors: launch/ray_replicas.py)."""

    def __init__(self, cfg: dict, spawner: Any = None) -> None:
        settings = settings_of(cfg)
        options = (
            settings.fault_tolerance
            if settings is not None
            else parse_fault_tolerance(cfg.get("fault_tolerance"))
        )
        if options is None:
            raise ConfigError("fault_tolerance", "this launcher runs fault-tolerant configs only")
        if torchft_missing():
            raise ConfigError(
                "fault_tolerance", "needs torchft: pip install 'distributed-runner[ft]'"
            )
        self.options, self.cfg = options, to_plain(cfg)
        self.cfg["work_dir"] = str(Path(self.cfg["work_dir"]).expanduser().resolve())
        self.resume = self.cfg.get("resume", False)
        self.run_name = choose_run(self.cfg["work_dir"], self.cfg.get("run_name"), self.resume)
        self.spawner = spawner or LocalProcesses(
            int(options["replicas"]), int(options["ranks_per_replica"])
        )
        self.procs: dict[int, Any] = {}
        self.replacements = self.restarts = 0
        self.started: dict[int, list[Any]] = {}  # every process each slot had, in order

    @property
    def pids(self) -> dict[int, list[int]]:
        """Every process id each slot had, in order."""
        return {slot: [proc.pid for proc in procs] for slot, procs in self.started.items()}

    def start(self, slot: int, resume: Any) -> None:
        env = {SLOT_ENV: str(slot), LIGHTHOUSE_ENV: self.address}
        env[REPLACEMENT_ENV] = "1" if resume is None else ""
        proc = self.spawner.spawn(slot, replica_config(self.cfg, slot, self.run_name, resume), env)
        self.procs[slot] = proc
        self.started.setdefault(slot, []).append(proc)

    def run(self) -> int:
        """Train to the end; 0 when every replica finished."""
        # torchft's lighthouse and managers log a line a step otherwise; read at first import
        os.environ.setdefault("RUST_LOG", "warn")
        from torchft.coordination import LighthouseServer

        opts = self.options
        self._lighthouse = LighthouseServer(
            bind="[::]:0",
            min_replicas=int(opts["min_replicas"]),
            join_timeout_ms=int(opts["join_timeout"] * 1000),
            heartbeat_timeout_ms=int(opts["heartbeat_timeout"] * 1000),
        )
        self.address = self._lighthouse.address().replace("[::]", self.spawner.host())
        try:
            for slot in range(int(opts["replicas"])):
                self.start(slot, self.resume)
            return self._watch()
        finally:
            self._stop_all()
            self._lighthouse.shutdown()
            self.spawner.close()

    def _watch(self) -> int:
        """Until a replica finishes (all hold the run's state: the run is done), replacing
        the lost ones; the others then get ``timeout`` seconds to finish their last step."""
        while True:
            time.sleep(POLL_S)
            ended = self._first_ended()
            if ended is None:
                continue
            slot, proc, code = ended
            if code == 0:
                return self._finish()
            if code > 0 and code not in (NO_PEER_EXIT, HANG_EXIT_CODE):
                error = getattr(proc, "error", None)  # a Ray actor's, pickled back
                if isinstance(error, ConfigError):
                    raise error  # drun's one line, as for a mistake the driver finds
                logger.error("replica %d failed (exit status %s): stopping the run", slot, code)
                return code  # it raised: its log says why, a replacement would raise again
            if not self._replace(slot, self._ended(code), healable=code != NO_PEER_EXIT):
                return 1

    def _first_ended(self) -> tuple[int, Any, int] | None:
        """(slot, process, exit status) of a replica that ended, taken out of the live ones;
        one at a time, as what is done about it (a restart) may replace them all."""
        for slot, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                del self.procs[slot]
                return slot, proc, code
        return None

    def _ended(self, code: int) -> str:
        """How a replica that is to be replaced ended, for the log line."""
        if code == HANG_EXIT_CODE:  # the hang watch's verdict: evicted, not waited for
            return (
                f"hung (the watchdog's verdict after watchdog.hang_timeout; its stacks are in "
                f"its run folder's {HANGS_DIR}/)"
            )
        return f"died ({self.spawner.describe(code)})"

    def _finish(self) -> int:
        deadline = time.monotonic() + float(self.options["timeout"])
        for proc in self.procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()  # a replacement still joining a run that has ended
        self.procs.clear()
        return 0

    def _replace(self, slot: int, ended: str, healable: bool = True) -> bool:
        """A replacement for ``slot``, or the fallback restart; False when neither is left
        (``healable``: False when it was a replacement that found no live peer to heal from)."""
        alive = len(self.procs)
        why = None
        if not healable:
            why = "no live replica was left to heal from"
        elif alive < int(self.options["min_replicas"]):
            why = f"{alive} replica(s) left, fewer than min_replicas={self.options['min_replicas']}"
        elif self.replacements >= int(self.options["max_replacements"]):
            why = f"{self.replacements} replacements used (fault_tolerance.max_replacements)"
        if why is None:
            self.replacements += 1
            logger.warning("replica %d %s: starting a replacement", slot, ended)
            self.start(slot, None)  # a replacement: it heals from a live peer, not from a file
            return True
        if self.restarts >= int(self.options["max_replacements"]):
            logger.error("replica %d %s and %s: giving up", slot, ended, why)
            return False
        self.restarts += 1
        logger.warning(
            "fault_tolerance: replica %d %s and %s: restarting every replica from the newest "
            "checkpoint",
            slot,
            ended,
            why,
        )
        self._stop_all()
        newest = read_pointer(run_dir(self.cfg["work_dir"], self.run_name))  # replica 0's
        for s in range(int(self.options["replicas"])):
            self.start(s, str(newest) if newest else False)
        return True

    def _stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait(10)
        self.procs.clear()


if __name__ == "__main__":
    replica_main(sys.argv[1])
