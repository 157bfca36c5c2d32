"""A sweep trial on Ray Train, driven directly (no Tune): rank 0's reports reach the trial with a
checkpoint of the exact state, the run is held at each report until released, and a stop request
ends it gracefully (after_train, last checkpoint) with its workers and placement group gone."""
import re
import time
from pathlib import Path

import pytest
import torch

from distributed_runner.config import Config
from distributed_runner.tune.ray_trial import RayTrainTrialRun

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
BATCH = 8
ITERS = -(-1437 // BATCH)  # iterations per epoch: the digits train split has 1437 samples


def digits_trial_cfg(work_dir):
    cfg = Config.fromfile(ROOT / "configs" / "digits_cnn.py", cfg_options=[
        f"work_dir={work_dir}", "train_cfg.max_epochs=6", f"train_dataloader.batch_size={BATCH}",
        "default_hooks.logger.interval=50"])
    cfg["launcher"] = dict(type="ray", num_workers=1)
    return cfg


def meta_iter(path):
    return torch.load(path, map_location="cpu", weights_only=False)["meta"]["iter"]


def live_new(before, table):
    return {k: v["state"] for k, v in table.items() if k not in before and v["state"] != "REMOVED"}


def test_reports_hold_resume_and_a_graceful_stop(ray_cluster, tmp_path):
    import ray

    pgs_before = set(ray.util.placement_group_table())
    cpus_before = ray.available_resources().get("CPU", 0.0)
    actors_before = set(ray._private.state.actors())
    run = RayTrainTrialRun(digits_trial_cfg(tmp_path), "trial_00001", poll_s=0.05)
    assert run.name == "trial_00001-g1"
    started = time.monotonic()
    run.start()
    first = run.next_report()
    startup = time.monotonic() - started
    assert first is not None and first.metrics["epoch"] == 1 and first.metrics["iter"] == ITERS
    assert first.metrics["val/accuracy"] == first.metrics["accuracy"] > 50
    assert meta_iter(first.checkpoint) == ITERS  # the reported file is the state reported
    # held: while the trial has not released the report, epoch 2 does not start
    time.sleep(1.5)
    log = Path(tmp_path, "logs", "run.log")
    assert "Epoch(train) [2]" not in log.read_text()
    assert not any(meta_iter(p) > ITERS for p in Path(tmp_path).glob("*.pth"))
    run.resume_after_report()
    second = run.next_report()
    assert second.metrics["epoch"] == 2 and meta_iter(second.checkpoint) == 2 * ITERS
    run.resume_after_report()
    asked = time.monotonic()
    run.request_stop("tune: trial_00001 stopped by the scheduler")
    assert run.wait(60)
    ended = time.monotonic() - asked
    assert run.error is None and run.next_report() is None
    # graceful: the loop's own stop, then after_train wrote the last checkpoint of that state
    text = log.read_text()
    stop = re.search(r"stop at iteration (\d+), requested by: tune: trial_00001 stopped by the "
                     r"scheduler", text)
    assert stop, text[-2000:]
    stopped_at = int(stop.group(1))
    assert 2 * ITERS < stopped_at <= 3 * ITERS  # mid-epoch 3 (polled) or at its report (held)
    last = Path(tmp_path, (Path(tmp_path) / "last_checkpoint").read_text().strip())
    assert meta_iter(last) == stopped_at
    assert "Epoch(train) [4]" not in text
    # within seconds, the trial's placement group is removed and its workers are gone
    deadline = time.monotonic() + 5
    while live_new(pgs_before, ray.util.placement_group_table()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_new(pgs_before, ray.util.placement_group_table()) == {}
    freed = time.monotonic() - asked
    assert ray.available_resources().get("CPU", 0.0) >= cpus_before
    new_actors = {k: a for k, a in ray._private.state.actors().items() if k not in actors_before}
    workers = [a for a in new_actors.values() if a["ActorClassName"] == "RayTrainWorker"]
    assert len(workers) == 1 and all(a["State"] == "DEAD" for a in workers)
    assert all(a["State"] == "DEAD" for a in new_actors.values()
               if a["ActorClassName"] == "TrialSignal")
    print(f"\nray trial: start to first report {startup:.1f} s; stop request to fit() returned "
          f"{ended:.2f} s, to placement group removed {freed:.2f} s; stopped at iteration "
          f"{stopped_at} ({'at the report' if stopped_at == 3 * ITERS else 'polled mid-epoch'})")
