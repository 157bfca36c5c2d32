"""Driver for test_node_failure.py, run in a process of its own (its Ray is a multi-node
cluster, not the test session's): a head without CPUs and three 1-CPU worker nodes, each a
raylet of its own (``ray.cluster_utils.Cluster``). Trains the toy model on 2 workers (one per
node: STRICT_SPREAD) while the node of rank 1 is removed — its raylet and every process on it
killed — after iteration 9; the restarted group runs on the two nodes left. The run it must
match is the session's uninterrupted one (test_ray_train's fixture: the same config on the
session's one-node cluster). Prints one JSON line."""
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from tests.integration.test_ray_train import fit, ray_cfg  # noqa: E402


def kill_the_marked_node(cluster: Cluster, marker: Path, report: dict) -> None:
    """Wait for rank 1's marker (its node id), then remove that node."""
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    if not marker.exists():
        return
    node_id = marker.read_text().strip()
    victim = next(n for n in cluster.list_all_nodes() if n.node_id == node_id)
    cluster.remove_node(victim, allow_graceful=False)  # the raylet and all its processes
    report["killed_node"] = node_id


def main(out: str) -> None:
    out_dir = Path(out)
    cluster = Cluster(initialize_head=True, head_node_args=dict(num_cpus=0,
                                                                include_dashboard=False))
    for _ in range(3):
        cluster.add_node(num_cpus=1, include_dashboard=False)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    report: dict = {"nodes": len([n for n in ray.nodes() if n["Alive"]])}
    launcher = dict(type="ray", num_workers=2, placement_strategy="STRICT_SPREAD")
    hooks = [dict(type="SyncBuffersHook"), dict(type="RankDumpHook")]
    marker = out_dir / "died" / "node_of_rank1"
    cfg = ray_cfg(out_dir / "died", launcher=dict(launcher, max_failures=1),
                  custom_hooks=hooks + [dict(type="MarkNodeHook", at_iter=9, rank=1)])
    killer = threading.Thread(target=kill_the_marked_node, args=(cluster, marker, report))
    killer.start()
    start = time.time()
    status, _, result = fit(cfg)
    killer.join()
    report.update(died=status, seconds=round(time.time() - start, 1),
                  final_iter=result.metrics.get("iter") if result is not None else None,
                  alive=[n["NodeID"] for n in ray.nodes() if n["Alive"]])
    print(json.dumps(report), flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
