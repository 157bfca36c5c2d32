"""Fault tolerance on Ray (launch/ray_replicas.py): each replica a Ray actor of the session's
cluster, the lighthouse in the driver. Replica 1's actor SIGKILLed mid-epoch, its first
replacement SIGKILLed while it heals, then replica 0's: no other actor's process restarts, no
checkpoint is read, every step is committed once, and the weights are one process's. Real
actors, a real lighthouse, real SIGKILLs, through the Ray driver's checks."""
import importlib.util

import pytest

from distributed_runner.launch.launcher import RayLauncher
from distributed_runner.launch.ray_replicas import RayActors
from distributed_runner.launch.replicas import ReplicaLauncher
from tests.unit.test_fault_tolerance import (
    cfg,
    check_hsdp,
    check_killed_in_turn,
    hsdp,
    killed_in_turn,
    one_process,  # noqa: F401 - the fixture: the same run in one process
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("torchft") is None, reason="no torchft"),
    pytest.mark.timeout(300),
]


def ray_cfg(work, **ft) -> dict:
    out = cfg(work, kill=(1, 5), pace=0.5, **ft)  # slow until the kills are over: actors start slowly under load
    out["launcher"] = dict(type="ray", num_workers=2)
    return out


@pytest.mark.slow("two replica actors on Ray, three of their processes SIGKILLed in turn")
def test_on_ray_a_killed_replica_actor_is_replaced_alone_and_the_weights_stay_exact(
    ray_cluster, tmp_path, one_process, monkeypatch  # noqa: F811
):
    work = tmp_path / "ft"
    run_cfg = killed_in_turn(ray_cfg(work))
    replicas = train_on_ray(run_cfg, monkeypatch)
    check_killed_in_turn(work, replicas, one_process)


def train_on_ray(run_cfg: dict, monkeypatch) -> ReplicaLauncher:
    """``run_cfg`` trained through the Ray driver (its checks: every section parsed, no worker
    started); the replica launcher it built, for its processes' ids."""
    seen: list[ReplicaLauncher] = []
    original = ReplicaLauncher.run

    def keep(self):
        seen.append(self)
        return original(self)

    monkeypatch.setattr(ReplicaLauncher, "run", keep)
    assert RayLauncher(run_cfg).train() == 0
    (replicas,) = seen
    assert isinstance(replicas.spawner, RayActors)
    return replicas


@pytest.mark.slow("two replica groups of two FSDP actors each on Ray, one actor SIGKILLed")
def test_on_ray_a_replica_group_of_fsdp_actors_losing_one_is_replaced_whole(
    ray_cluster, tmp_path, monkeypatch
):
    """HSDP on Ray: 4 actors, 2 a replica group meeting at their rank 0's node; rank 1 of group
    1 SIGKILLed: the driver kills its group's other actor and starts a new group in the same
    bundles, which heals its shards from group 0; group 0's actors never restart."""
    work = tmp_path / "ft"
    run_cfg = hsdp(work, pace=0.5)  # slow until healed: actors start slowly under load
    run_cfg["launcher"] = dict(type="ray", num_workers=4)
    check_hsdp(work, train_on_ray(run_cfg, monkeypatch))
