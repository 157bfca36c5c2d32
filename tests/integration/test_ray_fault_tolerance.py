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
    check_killed_in_turn,
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
    seen: list[ReplicaLauncher] = []
    original = ReplicaLauncher.run

    def keep(self):  # the launcher train_on_ray builds, for its processes' ids
        seen.append(self)
        return original(self)

    monkeypatch.setattr(ReplicaLauncher, "run", keep)
    launcher = RayLauncher(run_cfg)  # the driver's checks: every section parsed, no worker
    assert launcher.train() == 0
    (replicas,) = seen
    assert isinstance(replicas.spawner, RayActors)
    check_killed_in_turn(work, replicas, one_process)
