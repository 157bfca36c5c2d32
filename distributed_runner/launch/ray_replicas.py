"""A fault-tolerant run on a Ray cluster: each replica a Ray actor, a lost one replaced alone.

``launcher=dict(type='ray', num_workers=N, ...)`` with ``fault_tolerance=dict(mode='replicas',
replicas=N, ...)`` comes here from :meth:`RayLauncher.train
<distributed_runner.launch.launcher.RayLauncher.train>`, after the driver's checks. The driver
runs torchft's lighthouse (on its node's address) and places the ``N`` replicas as one Ray actor
each, in a placement group of ``N`` bundles (``resources_per_worker``, ``placement_strategy``):
the worker group. When an actor dies (its process killed, its node lost) or its watchdog calls
it hung, the others go on with the quorum they have and the driver starts one new actor in the
dead one's bundle, which heals from a live peer: no other actor restarts, no checkpoint is read
(:class:`~distributed_runner.launch.replicas.ReplicaLauncher` decides, as for local processes).

Not Ray Train: its worker group restarts as a whole on a failure, and its reports need every
worker (``ray.train.report`` is a barrier). Each actor runs the Runner as a local replica
process does (``launcher='none'`` in its config, its slot and the lighthouse in its
environment, the driver's ``MLFLOW_*``/``WANDB_*`` passed by reference); the replicas announce
their node's address to each other (``DRUN_REPLICA_HOST``). The run's folder is replica 0's on
its node: on several nodes ``work_dir`` is shared storage, as the fallback restart reads replica
0's newest checkpoint from there.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Any

from distributed_runner.fault_tolerance.replica import (
    HOST_ENV,
    NO_PEER_EXIT,
    NoLivePeer,
    join_rank_group,
)

ACTOR_DIED = -9  # what poll() gives for an actor whose process or node was lost


def _replica_actor() -> Any:
    """The actor class (built when Ray is imported: the driver's checks need no Ray)."""
    import ray

    @ray.remote(max_restarts=0, max_task_retries=0)
    class ReplicaActor:
        """One replica: the Runner of a local replica process, in a Ray worker process."""

        def pid(self) -> int:
            return os.getpid()

        def rendezvous(self) -> tuple[str, int]:
            """Where its replica group's other ranks meet this one (its rank 0)."""
            from distributed_runner.launch.replicas import free_port

            return ray.util.get_node_ip_address(), free_port("0.0.0.0")

        def train(self, cfg: dict, env: dict[str, str], forwarded: dict[str, str]) -> int:
            """``forwarded``: the driver's MLFLOW_*/WANDB_*, passed by reference (Ray resolves
            it here: it is in no task's arguments as text)."""
            from distributed_runner.engine.runner import Runner

            os.environ.update({**forwarded, **env})
            os.environ[HOST_ENV] = ray.util.get_node_ip_address()
            join_rank_group()  # one rank of a replica group of several
            try:
                Runner.from_cfg(cfg).train()
            except NoLivePeer as error:  # the driver falls back to a restart
                print(error, flush=True)
                return NO_PEER_EXIT
            return 0

    return ReplicaActor


class ActorReplica:
    """A replica actor with the methods the launcher uses of a ``subprocess.Popen``."""

    def __init__(self, actor: Any, done: Any, pid: Any) -> None:
        self.actor, self._done, self._pid = actor, done, pid
        self.returncode: int | None = None
        self.error: BaseException | None = None  # what it raised, when it raised

    @property
    def pid(self) -> int | None:
        """Its worker process (None when it died before it started)."""
        import ray

        try:
            return int(ray.get(self._pid, timeout=60))
        except ray.exceptions.RayError:
            return None

    def poll(self) -> int | None:
        import ray

        if self.returncode is not None:
            return self.returncode
        ready, _ = ray.wait([self._done], timeout=0)
        if ready:
            self.returncode = self._result()
            # an actor outlives its task (one that raised, or returned NO_PEER_EXIT): it would
            # hold its bundle, and the replacement started there would wait for it for ever
            self.kill()
        return self.returncode

    def _result(self) -> int:
        import ray

        try:
            return int(ray.get(self._done))
        except ray.exceptions.RayActorError:  # its process, or its node, is gone
            return ACTOR_DIED
        except ray.exceptions.RayTaskError as raised:  # its log says why; a ConfigError is a line
            cause = getattr(raised, "cause", None)
            self.error = cause if isinstance(cause, BaseException) else raised
            return 1

    def kill(self) -> None:
        import ray

        with contextlib.suppress(ValueError):  # an actor Ray no longer knows: gone already
            ray.kill(self.actor, no_restart=True)

    def wait(self, timeout: float | None = None) -> int:
        import ray

        ready, _ = ray.wait([self._done], timeout=timeout)
        if not ready:
            raise subprocess.TimeoutExpired("replica actor", timeout or 0)
        return self.poll() or 0


class RayActors:
    """The spawner of :class:`~distributed_runner.launch.replicas.ReplicaLauncher` on Ray: a
    placement group of one bundle a replica, an actor a replica in its slot's bundle."""

    where = "Ray actors"

    def __init__(
        self, launcher_opts: dict, resources: dict[str, float], env: Any, ranks: int = 1
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group

        self.env = env  # the driver's MLFLOW_*/WANDB_*: an object reference
        self.resources, self.ranks = resources, ranks
        workers = int(launcher_opts["num_workers"])  # replicas x ranks_per_replica
        self.group = placement_group(
            [dict(resources) for _ in range(workers)],
            strategy=launcher_opts["placement_strategy"],
        )
        ray.get(self.group.ready(), timeout=120)
        self._actor = _replica_actor()

    def host(self) -> str:
        """The driver's node address: the lighthouse runs in the driver."""
        import ray

        return str(ray.util.get_node_ip_address())

    def spawn(self, slot: int, cfg: dict, env: dict[str, str]) -> Any:
        """Replica ``slot``: one actor in its bundle, or a :class:`~distributed_runner.launch.
        replicas.RankGroup` of ``ranks`` actors in its ``ranks`` bundles, which meet at their
        rank 0's node."""
        import ray

        from distributed_runner.launch.replicas import RankGroup

        if self.ranks == 1:
            return self._start(self._new_actor(slot), cfg, env)
        actors = [self._new_actor(slot * self.ranks + r) for r in range(self.ranks)]
        host, port = ray.get(actors[0].rendezvous.remote(), timeout=120)
        meet = {"MASTER_ADDR": host, "MASTER_PORT": str(port), "WORLD_SIZE": str(self.ranks)}
        return RankGroup(
            [
                self._start(actor, cfg, {**env, **meet, "RANK": str(r), "LOCAL_RANK": "0"})
                for r, actor in enumerate(actors)
            ]
        )

    def _start(self, actor: Any, cfg: dict, env: dict[str, str]) -> ActorReplica:
        pid = actor.pid.remote()  # the actor runs its calls in order: this one first
        return ActorReplica(actor, actor.train.remote(cfg, env, self.env), pid)

    def _new_actor(self, bundle: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cpus = self.resources.get("CPU", 1)
        gpus = self.resources.get("GPU", 0)
        custom = {k: v for k, v in self.resources.items() if k not in ("CPU", "GPU")}
        return self._actor.options(
            num_cpus=cpus,
            num_gpus=gpus,
            resources=custom or None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=bundle
            ),
            # torchft's lighthouse and managers log a line a step otherwise (read at import)
            runtime_env={"env_vars": {"RUST_LOG": os.environ.get("RUST_LOG", "warn")}},
        ).remote()

    def describe(self, code: int) -> str:
        return "its Ray actor died" if code == ACTOR_DIED else f"exit {code}"

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.group)


def _replica_words(options: dict) -> str:
    replicas, ranks = options["replicas"], int(options["ranks_per_replica"])
    return f"{replicas} replicas, " + ("one actor each" if ranks == 1 else f"{ranks} actors each")


def train_on_ray(launcher: Any) -> int:
    """:meth:`RayLauncher.train` for a fault-tolerant config: connect, check the cluster can
    hold the replicas, name the run, and run the replicas as actors (module docstring)."""
    import ray

    from distributed_runner.launch.ray_connect import forwarded_env
    from distributed_runner.launch.replicas import ReplicaLauncher

    launcher.connect()
    launcher.check_resources(ray.cluster_resources())
    launcher.choose_run()
    opts = launcher.opts
    cfg = dict(launcher.plan.cfg)  # prepared and checked, its paths made absolute
    cfg.update(work_dir=str(launcher.work_dir), run_name=launcher.run_name, launcher="none")
    print(f"distributed-runner on Ray: joined {launcher.joined}", flush=True)
    print(
        f"distributed-runner on Ray: {_replica_words(launcher.settings.fault_tolerance)} "
        f"(fault_tolerance), a lost one replaced alone | run {launcher.run_dir}"
        f"{launcher.mlflow_note()}",
        flush=True,
    )
    env = ray.put(forwarded_env(reads_object_storage=launcher.plan.remote))
    ranks = int(launcher.settings.fault_tolerance["ranks_per_replica"])
    spawner = RayActors(opts, launcher.worker_resources(), env, ranks)
    return ReplicaLauncher(cfg, spawner).run()
