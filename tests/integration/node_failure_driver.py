"""Driver for test_node_failure.py, run in a process of its own (its Ray is a multi-node
cluster, not the test session's): a head without CPUs and three 1-CPU worker nodes, each a
raylet of its own (``ray.cluster_utils.Cluster``). Trains the toy model on 2 workers (one per
node: STRICT_SPREAD) while the node of rank 1 is removed — its raylet and every process on it
killed — after iteration 9; the restarted group runs on the two nodes left. The run it must
match is the session's uninterrupted one (test_ray_train's fixture: the same config on the
session's one-node cluster). With ``--elastic`` the same cluster then runs
:func:`elastic_run`: a group shrunk by a lost node and grown again by a new one; with ``--hang``,
:func:`hang_run`: a rank stopped with SIGSTOP on a node that is not the Train controller's (its
stacks read by py-spy from a task on that node). Prints one JSON line."""
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402
import torch  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from distributed_runner import Runner  # noqa: E402
from tests.integration.test_ray_train import elastic_cfg, fit, ray_cfg  # noqa: E402


def kill_the_marked_node(cluster: Cluster, marker: Path, report: dict,
                         key: str = "killed_node") -> None:
    """Wait for rank 1's marker (its node id), then remove that node."""
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline:
        time.sleep(0.05)
    if not marker.exists():
        return
    node_id = marker.read_text().strip()
    victim = next(n for n in cluster.list_all_nodes() if n.node_id == node_id)
    cluster.remove_node(victim, allow_graceful=False)  # the raylet and all its processes
    report[key] = node_id


def wait_until_not_alive(node_id: str | None, seconds: float = 60.0) -> float:
    """Give the GCS time to mark a killed node dead: it learns it from missed health checks, and
    the restarted run can finish first on a fast machine (then the node still read alive)."""
    start = time.time()
    while node_id and time.time() < start + seconds and any(
            n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
        time.sleep(0.5)
    return round(time.time() - start, 1)


def hang_run(out_dir: Path, report: dict) -> None:
    """On two worker nodes (one rank each; the controller on the CPU-less head): rank 1 is
    stopped with SIGSTOP at iteration 11; the hang watch names it, reads its stacks on its node,
    kills it, and the group resumes from iteration 8 (the hang test's config and probes)."""
    from tests.integration.test_hang_watch import hang_cfg, stop_when_asked

    work_dir = out_dir / "hang"
    work_dir.mkdir(parents=True)
    cfg = hang_cfg(work_dir, dict(type="StopMeOnceHook", at_iter=11, rank=1))
    cfg["launcher"] = dict(cfg["launcher"], placement_strategy="STRICT_SPREAD")
    # no setup hang is tested here: each restarted group's build on 4 raylets and 2 cores may
    # take longer than the hang test's 6 s (a second report, CI of 2026-12-02)
    cfg["watchdog"] = dict(cfg["watchdog"], phase_timeouts=dict(first_iter=120))
    stopped: dict = {}
    threading.Thread(target=stop_when_asked, args=(work_dir, stopped), daemon=True).start()
    start = time.time()
    status = fit(cfg)[0]
    reports = sorted((work_dir / "hangs").glob("*.txt"))
    text = reports[0].read_text() if reports else ""
    rank1 = text.split("== rank 1 ==")[1].split("== rank 0 ==")[0] if "== rank 1 ==" in text else ""
    report.update(
        hang=status,
        hang_seconds=round(time.time() - start, 1),
        hang_reports=len(reports),
        hang_firsts=[p.read_text().split("\n", 1)[0][:300] for p in reports],
        hang_rank1=rank1[:4000],
        hang_report_after_s=round(reports[0].stat().st_mtime - stopped["stopped_at"], 2)
        if reports and "stopped_at" in stopped else None,
        hang_starts=[int(line.split()[1]) for line in
                     (work_dir / "starts.txt").read_text().splitlines()],
    )


def elastic_run(cluster: Cluster, out_dir: Path, report: dict) -> None:
    """On the two nodes left: an elastic (1, 2) group loses the node of rank 1 after iteration
    4 (restarts alone from iteration 3); alone, after iteration 7 (its checkpoint at 6 written),
    a new node joins and Ray grows the group back to 2, which resumes from 6 and finishes."""
    work_dir = out_dir / "elastic"
    launcher = dict(type="ray", num_workers=(1, 2), max_failures=4,
                    elastic_resize_monitor_interval_s=1)
    hooks = [dict(type="RecordGroupHook"), dict(type="RankDumpHook"),
             dict(type="MarkNodeHook", at_iter=4, rank=1),
             dict(type="WaitWhileAloneHook", at_iter=7)]
    cfg = elastic_cfg(work_dir, launcher=launcher, custom_hooks=hooks)
    outcome: dict = {}
    trainer = threading.Thread(target=lambda: outcome.update(status=fit(cfg)[0]))
    killer = threading.Thread(target=kill_the_marked_node,
                              args=(cluster, work_dir / "node_of_rank1", report,
                                    "elastic_killed_node"))
    start = time.time()
    trainer.start()
    killer.start()
    alone = work_dir / "alone"
    while not alone.exists() and trainer.is_alive():
        time.sleep(0.1)
    if alone.exists():  # Cluster.add_node must run on the main thread
        cluster.add_node(num_cpus=1, include_dashboard=False)
        report["added_node_after_s"] = round(time.time() - start, 1)
    trainer.join()
    killer.join()
    report.update(elastic=outcome.get("status"), elastic_seconds=round(time.time() - start, 1))
    # the same config never resized, trained here in one process (the same global batches)
    steady = Runner.from_cfg(dict(elastic_cfg(out_dir / "steady"), custom_hooks=[]))
    steady.train()
    torch.save(steady.model.state_dict(), out_dir / "steady.pt")


def main(out: str, elastic: bool, hang: bool = False) -> None:
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
    report["waited_for_node_death_s"] = wait_until_not_alive(report.get("killed_node"))
    report.update(died=status, seconds=round(time.time() - start, 1),
                  final_iter=result.metrics.get("iter") if result is not None else None,
                  alive=[n["NodeID"] for n in ray.nodes() if n["Alive"]])
    if elastic:
        elastic_run(cluster, out_dir, report)
    if hang:
        hang_run(out_dir, report)
    print(json.dumps(report), flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], elastic="--elastic" in sys.argv, hang="--hang" in sys.argv)
