"""Real Ray Train runs (CPU, gloo, 2 workers): DDP equivalence, rank-aware hooks, master-only
checkpoints reported to Ray, exact resume after a worker dies, after a whole node dies (on a
multi-node cluster of its own) and after a driver rerun."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from ray.train import TrainingFailedError

from distributed_runner import Runner
from distributed_runner.core.errors import ConfigError
from distributed_runner.launch.launcher import RayLauncher, normalize_launcher
from tests.toy import base_cfg

pytestmark = [pytest.mark.integration, pytest.mark.slow("Ray Train runs: deaths, restarts, a killed node"),
              pytest.mark.timeout(240)]

DATA = dict(train_dataloader=dict(dataset=dict(type="ToyDataset", n=40, with_index=True),
                                  batch_size=4, sampler=dict(type="DefaultSampler", shuffle=True)))


def ray_cfg(work_dir, workers=2, **overrides):
    cfg = base_cfg(work_dir, **DATA)
    cfg.update(custom_imports=dict(imports=["tests.ray_probe"]),
               launcher=dict(type="ray", num_workers=workers),
               default_hooks=dict(logger=dict(type="LoggerHook", interval=5, sinks=["jsonl"]),
                                  checkpoint=dict(type="CheckpointHook", interval=7,
                                                  by_epoch=False)))
    cfg.update(overrides)
    return cfg


def elastic_cfg(work_dir, **overrides):
    """An elastic (1, 2) run of a transformer toy (ToyGPT: LayerNorm, no batch statistics) with
    DDP: global batches of 8 from 40 samples, 5 iterations an epoch, 15 in all, a checkpoint
    every 3."""
    cfg = ray_cfg(work_dir, model=dict(type="ToyGPT"),
                  launcher=dict(type="ray", num_workers=(1, 2)),
                  train_dataloader=dict(dataset=dict(type="ToyTokens", n=40), batch_size=4,
                                        sampler=dict(type="DefaultSampler", shuffle=True)),
                  val_dataloader=None, val_evaluator=None, val_cfg=None)
    cfg["default_hooks"]["checkpoint"]["interval"] = 3
    cfg.update(overrides)
    return cfg


def fit(cfg):
    """(exit status as ``drun`` gives it, the launcher, Ray's Result or None on failure)."""
    launcher = RayLauncher(cfg, normalize_launcher(cfg["launcher"]))
    try:
        result = launcher.fit()
    except TrainingFailedError:
        return 1, launcher, None
    return 0, launcher, result


def dumps(work_dir):
    return [torch.load(Path(work_dir) / f"dump_rank{r}.pt", weights_only=True) for r in (0, 1)]


def equal_states(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def actors_started(class_name: str) -> int:
    """How many actors of ``class_name`` this cluster has started, alive or dead (the GCS's
    actor table: there is no dashboard to ask)."""
    from ray._private import state

    return sum(a["ActorClassName"] == class_name for a in state.actors().values())


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tmp_path_factory):
    """3 epochs on 2 workers with SyncBuffersHook; a checkpoint every 7 iterations (DieOnceHook
    without ``at_iter`` never fires: the config is the death test's, uninterrupted)."""
    wd = tmp_path_factory.mktemp("uninterrupted")
    dataset_actors = actors_started("DatasetManager")
    status, launcher, result = fit(ray_cfg(wd, custom_hooks=[dict(type="SyncBuffersHook"),
                                                        dict(type="DieOnceHook"),
                                                        dict(type="RankDumpHook")]))
    assert status == 0
    launcher.dataset_actors = actors_started("DatasetManager") - dataset_actors
    return wd, (launcher, result)


def test_a_run_without_ray_datasets_starts_no_dataset_actor(uninterrupted):
    """Ray Train starts a DatasetManager actor (a process importing Ray Data) at each group
    start; drun leaves it out of a run without Ray Datasets (core/ray_private.py)."""
    _, (launcher, _) = uninterrupted
    assert launcher.dataset_actors == 0


def test_ranks_see_disjoint_covering_shards_reshuffled_each_epoch(uninterrupted):
    wd, _ = uninterrupted
    seen = [d["seen"] for d in dumps(wd)]
    for epoch in range(3):
        parts = [s[epoch * 20:(epoch + 1) * 20] for s in seen]
        assert not set(parts[0]) & set(parts[1])
        assert sorted(parts[0] + parts[1]) == list(range(40))
    assert seen[0][:20] != seen[0][20:40]  # a new order every epoch


def test_sync_buffers_makes_bn_statistics_identical(uninterrupted):
    wd, _ = uninterrupted
    r0, r1 = (d["state"] for d in dumps(wd))
    assert torch.equal(r0["bn.running_mean"], r1["bn.running_mean"])
    assert torch.equal(r0["bn.running_var"], r1["bn.running_var"])
    assert equal_states(r0, r1)


def test_a_uniform_run_names_no_straggler_and_logs_each_ranks_figure(uninterrupted):
    wd, _ = uninterrupted
    train = [r for r in map(json.loads, (wd / "logs" / "scalars.jsonl").open())
             if r["mode"] == "train"]
    assert train and all({"straggler/rank_0_s", "straggler/rank_1_s"} <= r.keys() for r in train)
    assert "straggler: rank" not in (wd / "logs" / "run.log").read_text()


def test_only_rank_0_writes_and_ray_lists_the_checkpoints(uninterrupted):
    wd, (launcher, result) = uninterrupted
    writes = (wd / "writes.txt").read_text().split("\n")
    ranks = {line.split()[0] for line in writes if line}
    assert ranks == {"0"}
    # 20 samples per rank, batch 4: 5 iterations an epoch, 15 in all; a checkpoint every 7
    names = [line.split()[1] for line in writes if line]
    assert names == ["iter_7.pth", "iter_14.pth", "last.pth"]
    storage = Path(launcher.storage_path) / launcher.name
    reported = sorted(p.name.rsplit("-", 1)[0] for p in storage.iterdir() if p.is_dir())
    assert reported == ["iter_14", "iter_7", "last"]
    for folder in (p for p in storage.iterdir() if p.is_dir()):  # the checksum travels along
        stem = folder.name.rsplit("-", 1)[0]
        assert sorted(f.name for f in folder.iterdir()) == [f"{stem}.pth", f"{stem}.pth.crc32"]
    assert result.checkpoint is not None and result.metrics["iter"] == 15


def test_worker_death_mid_epoch_resumes_exactly(uninterrupted, tmp_path):
    """DDP with its checkpoint written in the background (one file, rank 0's): a worker killed
    after iteration 9 (or the first after it at which iteration 7's save is persisted) comes
    back from iteration 7, replays no batch, and ends with the uninterrupted run's weights."""
    ref_wd, _ = uninterrupted
    cfg = ray_cfg(tmp_path, custom_hooks=[dict(type="SyncBuffersHook"),
                                          dict(type="DieOnceHook", at_iter=9, persisted=7),
                                          dict(type="RankDumpHook")])
    cfg["launcher"]["max_failures"] = 1
    cfg["default_hooks"]["checkpoint"]["async_save"] = True
    status, _, _ = fit(cfg)
    assert status == 0 and 9 <= int((tmp_path / "died_once").read_text()) < 14
    after, ref = dumps(tmp_path), dumps(ref_wd)
    assert equal_states(after[0]["state"], ref[0]["state"])
    assert equal_states(after[1]["state"], ref[1]["state"])
    # restarted from iter_7, 2 batches into epoch 2: the rest of the run, no batch replayed
    for rank in (0, 1):
        assert after[rank]["seen"] == ref[rank]["seen"][7 * 4:]


@pytest.mark.timeout(540)
@pytest.mark.serial("node deaths and a hang detected within seconds on 4 raylets")
def test_a_killed_node_is_left_behind_and_an_elastic_group_shrinks_and_grows(uninterrupted,
                                                                             tmp_path):
    """A real multi-node cluster on this machine (a head and three 1-CPU worker nodes, each its
    own raylet; tests/integration/node_failure_driver.py, in a process of its own).

    Fixed size: the node of rank 1 is removed after iteration 9 — its raylet and every process
    on it killed. The run resumes from iteration 7 on the nodes left and ends as the
    uninterrupted run did, bit for bit. Elastic, ``num_workers=(1, 2)``, on the two nodes left:
    a node is lost after iteration 4 and the group goes on alone from iteration 3; alone, it
    writes the iteration-6 checkpoint; a new node joins and Ray grows the group back to 2,
    which resumes from 6. It ends within 1e-5 of the same config trained without resizing.
    Hang (``--hang``), on the two worker nodes then alive: rank 1 is stopped with SIGSTOP; the
    controller (on the head) names it with the stacks py-spy read on rank 1's node, and the run
    resumes from iteration 8 (test_hang_watch.py checks the resumed weights on one node)."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.1",
               RAY_USAGE_STATS_ENABLED="0", RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="10",
               # the GCS declares a killed node dead after 3 missed 0.5 s checks, not 5 of 3 s
               # (Ray's defaults): the test took 135 s with them, 112 s so
               RAY_health_check_period_ms="500", RAY_health_check_failure_threshold="3",
               RAY_health_check_timeout_ms="1000")
    done = subprocess.run([sys.executable, str(Path(__file__).with_name(
        "node_failure_driver.py")), str(tmp_path), "--elastic", "--hang"], env=env,
        capture_output=True,
        text=True, timeout=480)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["nodes"] == 4  # the head and 3 worker nodes
    assert report["died"] == 0 and report["final_iter"] == 15
    assert report["killed_node"] and report["killed_node"] not in report["alive"], \
        f"still alive {report['waited_for_node_death_s']} s after the run"
    after, ref = dumps(tmp_path / "died"), dumps(uninterrupted[0])
    for rank in (0, 1):
        assert equal_states(after[rank]["state"], ref[rank]["state"]), f"rank {rank}"
        assert after[rank]["seen"] == ref[rank]["seen"][7 * 4:]  # no batch replayed

    assert report["elastic"] == 0, done.stderr[-3000:]
    assert report["elastic_killed_node"] and report.get("added_node_after_s")
    # (iteration the group started at, its size): 2 workers, 1 from iteration 3, 2 from 6
    groups = (tmp_path / "elastic" / "groups.txt").read_text().split()
    assert [(int(i), int(w)) for i, w in zip(groups[::2], groups[1::2])] == \
        [(0, 2), (3, 1), (6, 2)]
    resized = torch.load(tmp_path / "elastic" / "dump_rank0.pt", weights_only=True)
    reference = torch.load(tmp_path / "steady.pt", weights_only=True)  # never resized
    assert resized["iter"] == 15 and resized["world_size"] == 2
    gap = max(((resized["state"][k] - v).abs().max() / v.abs().max()).item()
              for k, v in reference.items())
    assert gap < 1e-5

    assert report["hang"] == 0, done.stderr[-3000:]
    assert report["hang_reports"] == 1, report["hang_firsts"]
    assert report["hang_rank1"].startswith(" (pid "), report["hang_rank1"][:300]
    assert "stacks read by py-spy on its node)" in report["hang_rank1"].splitlines()[0]
    assert "wait_to_be_stopped" in report["hang_rank1"]
    assert report["hang_starts"] == [0, 8]
    print(f"multi-node hang: report {report['hang_report_after_s']} s after SIGSTOP; "
          f"run {report['hang_seconds']} s")


def test_ddp_matches_one_process_with_the_double_batch(ray_cluster, tmp_path):
    """2 Ray workers x batch 4 over 41 samples (a prime: DefaultSampler cannot split it) train
    every sample once an epoch, as one process with batch 8 does (5 full global batches, then one
    of 1, weighted: data/elastic.py exact_epochs); and the 2 workers' checkpoint of iteration 7
    resumed in one process (data/world_change.py: the global batch of 8 kept, as 2 micro-batches
    of 4) ends with the same weights (issue 48)."""
    common = dict(model=dict(type="ToyLinear"), val_dataloader=None, val_evaluator=None,
                  val_cfg=None, optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.5)),
                  train_cfg=dict(by_epoch=True, max_epochs=2),
                  train_dataloader=dict(dataset=dict(type="ToyDataset", n=41), batch_size=4))
    status, _, _ = fit(ray_cfg(tmp_path / "ddp", custom_hooks=[dict(type="RankDumpHook")],
                               **common))
    assert status == 0
    ddp = dumps(tmp_path / "ddp")[0]["state"]
    import tests.ray_probe  # noqa: F401  (ToyLinear in this process)
    single = base_cfg(tmp_path / "single", **common)
    single["train_dataloader"] = dict(dataset=dict(type="ToyDataset", n=41), batch_size=8)
    runner = Runner.from_cfg(single)
    runner.train()
    assert runner.iter == 12  # 6 iterations an epoch: 5 of 8 samples, then 1
    for k, v in runner.model.state_dict().items():
        assert torch.allclose(v, ddp[k], atol=1e-5), k
    alone = base_cfg(tmp_path / "alone", resume=str(tmp_path / "ddp" / "iter_7.pth"), **common)
    resumed = Runner.from_cfg(alone)  # one process, batch_size 4: the saved global batch kept
    resumed.train()
    assert resumed.iter == 12 and resumed.elastic_plan.micro_batches == 2
    for k, v in resumed.model.state_dict().items():
        assert torch.allclose(v, ddp[k], atol=1e-5), k


def test_impossible_requests_fail_fast_with_one_line(ray_cluster, tmp_path):
    for launcher, key in ((dict(type="ray", num_workers=2, use_gpu=True), "launcher.use_gpu"),
                          (dict(type="ray", num_workers=9), "launcher.num_workers")):
        start = time.perf_counter()
        with pytest.raises(ConfigError) as err:
            fit(ray_cfg(tmp_path, launcher=launcher))
        assert time.perf_counter() - start < 10
        assert str(err.value).startswith(key + ":") and "\n" not in str(err.value)


def test_worker_errors_make_the_driver_fail_and_the_mlflow_run_failed(ray_cluster, mlflow_server,
                                                                     tmp_path):
    """Rank 0 — the one holding the MLflow run — is killed after the iteration-7 checkpoint and
    Ray may not restart it: the driver exits 1 and ends the MLflow run FAILED (the dead worker
    could not), instead of leaving it RUNNING forever."""
    from mlflow.tracking import MlflowClient

    cfg = ray_cfg(tmp_path, custom_hooks=[dict(type="DieOnceHook", at_iter=9, rank=0)])
    cfg["default_hooks"]["logger"]["sinks"] = [dict(type="MLflowSink",
                                                    tracking_uri=mlflow_server.uri)]
    assert RayLauncher(cfg, normalize_launcher(cfg["launcher"])).train() == 1  # as drun runs it
    run_id = json.loads((tmp_path / "mlflow_run.json").read_text())["run_id"]
    assert MlflowClient(mlflow_server.uri).get_run(run_id).info.status == "FAILED"


@pytest.mark.timeout(360)
def test_a_second_driver_run_resumes_and_a_newer_checkpoint_than_ray_registered_wins(ray_cluster,
                                                                                     tmp_path):
    """Three drivers on one run name (two tests merged, each of which trained 15 iterations
    first; issue 47). A second driver run with the same name resumes: after 2 epochs, a run to
    3 trains only the third. Then a worker killed right after a report can leave a checkpoint
    persisted under the run's storage that Ray's controller never registered, and Ray hands
    back an older one. Made deterministic: Ray's checkpoint-manager snapshot forgets every
    checkpoint after iteration 7, and a third driver runs one more epoch. Ray hands back iter_7;
    the workers resume from last.pth (iteration 15), which is newer and verifies."""
    hooks = [dict(type="RankDumpHook")]
    status, first, _ = fit(ray_cfg(tmp_path, custom_hooks=hooks,
                                   train_cfg=dict(by_epoch=True, max_epochs=2)))
    assert status == 0
    r0, r1 = (d["state"] for d in dumps(tmp_path))
    # without SyncBuffersHook each rank keeps its own BN statistics
    assert not torch.equal(r0["bn.running_mean"], r1["bn.running_mean"])
    status, second, _ = fit(ray_cfg(tmp_path, custom_hooks=hooks,
                                    train_cfg=dict(by_epoch=True, max_epochs=3)))
    assert status == 0 and second.name == first.name
    rerun = dumps(tmp_path)[0]
    assert rerun["iter"] == 15 and len(rerun["seen"]) == 20  # only the third epoch was trained

    snapshot = tmp_path / "ray_storage" / tmp_path.name / "checkpoint_manager_snapshot.json"
    state = json.loads(snapshot.read_text())
    kept = [r for r in state["checkpoint_results"] if r["metrics"]["iter"] == 7]
    state.update(checkpoint_results=kept, checkpoint_report_indices=list(range(len(kept))),
                 latest_checkpoint_result=kept[-1], current_report_index=len(kept))
    snapshot.write_text(json.dumps(state))
    status, _, result = fit(ray_cfg(tmp_path, log_level="INFO", train_cfg=dict(
        by_epoch=True, max_epochs=4, val_interval=1)))
    assert status == 0 and result.metrics["iter"] == 20
    log = (tmp_path / "logs" / "run.log").read_text().split("Ray handed back", 1)
    assert len(log) == 2, "the restart did not say which checkpoint it chose"
    assert log[1].startswith(" iter_7.pth; resuming from ") and "last.pth instead" in log[1]
    assert "(epoch 3, iter 15)" in log[1]
    # no iteration repeated: iter_14 was not written again, only the new last.pth (the first
    # driver wrote iter_7 and last at 10, the second iter_14 and last at 15)
    writes = [line.split()[1] for line in (tmp_path / "writes.txt").read_text().splitlines()]
    assert writes == ["iter_7.pth", "last.pth", "iter_14.pth", "last.pth", "last.pth"]
