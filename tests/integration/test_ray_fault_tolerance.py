"""Fault tolerance on Ray (launch/ray_replicas.py): each replica a Ray actor of the session's
cluster, the lighthouse in the driver. Replica 1's actor SIGKILLed mid-epoch, its first
replacement SIGKILLed while it heals, then replica 0's: no other actor's process restarts, no
checkpoint is read, every step is committed once, and the weights are one process's. Real
actors, a real lighthouse, real SIGKILLs, through the Ray driver's checks."""
import importlib.util

import pytest
import torch

from distributed_runner.launch.launcher import RayLauncher
from distributed_runner.launch.ray_replicas import RayActors
from distributed_runner.launch.replicas import ReplicaLauncher
from tests.unit.test_fault_tolerance import (
    EPOCHS,
    cfg,
    close,
    diary,
    final_weights,
    iterations,
    killed_at,
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
    run_cfg = ray_cfg(work)
    markers = [f"{work}.killed", f"{work}.healing", f"{work}.rejoined"]
    run_cfg["custom_hooks"] += [
        dict(type="KillWhileHealing", slot=1, marker=markers[1]),
        dict(type="KillAfterRejoin", slot=0, marker=markers[2]),
        dict(type="MarkWhenWhole", markers=markers, path=f"{work}.whole"),
    ]
    run_cfg["custom_hooks"][1]["until"] = f"{work}.whole"  # Pace: fast once the kills are over
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
    records, total = diary(work), EPOCHS * 9
    zero, one = replicas.pids[0], replicas.pids[1]
    assert (len(zero), len(one)) == (2, 3)  # killed: 0 once, 1 twice (its first replacement too)
    start, done = iterations(records, zero[0])  # the first replica 0: never restarted
    assert start <= 3 and done == list(range(start, done[-1] + 1))  # a peer may start first
    lost = [(r["slots"], r["iter"]) for r in records if r["pid"] == zero[0] and r["kind"] == "lost"]
    at = killed_at(f"{work}.killed")  # 5, or later when replica 1 joined late
    assert lost == [([1], at - 1)]  # that iteration (0-based) trained again without replica 1
    assert [r for r in records if r["pid"] == one[1]] == []  # killed while it healed
    healed_one, done_one = iterations(records, one[2])
    assert at < healed_one and done_one == list(range(healed_one, total))  # no checkpoint: no replay
    healed_zero, done_zero = iterations(records, zero[1])
    assert done[-1] < healed_zero and done_zero == list(range(healed_zero, total))
    weights_zero = final_weights(work / replicas.run_name)
    weights_one = final_weights(work / "replicas" / "1" / replicas.run_name)
    for key, value in weights_zero.items():
        assert torch.equal(value, weights_one[key]), key
    assert close(weights_zero, one_process) < 1e-5  # every sample once: one process's weights

