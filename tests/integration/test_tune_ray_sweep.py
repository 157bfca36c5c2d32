"""``drun tune --trial-launcher ray`` as a user runs it (a subprocess joining the session's Ray
cluster, so that this test can read the cluster's placement groups afterwards): ASHA stops the
weak trial, the stop is the run's own (after_train, last checkpoint of that state), and no
placement group of any trial is left."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.integration, pytest.mark.slow("a drun tune sweep of Ray Train trials"),
              pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
LR = "optim_wrapper.optimizer.lr"


def test_asha_stops_a_ray_train_trial_gracefully_and_frees_its_placement_group(ray_cluster,
                                                                                tmp_path):
    import pyarrow.parquet as pq
    import ray

    pgs_before = set(ray.util.placement_group_table())
    address = ray.get_runtime_context().gcs_address
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env.pop("RAY_ADDRESS", None)
    # in this order, one at a time: the good rate sets the first rung, the bad one falls below it
    space = {LR: {"type": "grid_search", "values": [3e-3, 1e-5]}}
    work_dir = tmp_path / "sweep"
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "distributed_runner.cli", "tune", "configs/digits_tune.py",
         "--work-dir", str(work_dir), "--trial-launcher", "ray", "--num-workers", "1",
         "--max-concurrent-trials", "1", "--address", address, "--cfg-options",
         "train_cfg.max_epochs=3", f"tune.param_space={space!r}", "tune.num_samples=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=220)
    wall = time.monotonic() - start
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {r[LR]: r for r in pq.read_table(work_dir / "tune_results.parquet").to_pylist()}
    assert {r["status"] for r in rows.values()} == {"TERMINATED"}
    good, bad = rows[3e-3], rows[1e-5]
    assert not good["stopped_early"] and good["epoch"] == 3
    assert bad["stopped_early"] and bad["epoch"] == 1
    trial = Path(bad["work_dir"])
    log = (trial / "logs" / "run.log").read_text()
    assert (f"stop at iteration {bad['iter']}, requested by: tune: trial stopped or paused by "
            "the scheduler") in log
    last = trial / (trial / "last_checkpoint").read_text().strip()
    assert torch.load(last, weights_only=False)["meta"]["iter"] == bad["iter"]
    assert "INFO Hook time (cumulative" in log  # after_train's table: the run ended itself
    # each trial was its own Train run in its own work_dir, and no placement group outlived it
    for row in rows.values():
        assert [p.name for p in (Path(row["work_dir"]) / "ray_storage").iterdir()] == [
            f"{row['trial_id']}-g1"]
    left = {k: v["state"] for k, v in ray.util.placement_group_table().items()
            if k not in pgs_before and v["state"] != "REMOVED"}
    assert left == {}
    print(f"\nASHA sweep on Ray Train trials: {wall:.0f} s, 2 trials, 1 stopped early")
