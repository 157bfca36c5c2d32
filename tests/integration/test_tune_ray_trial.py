"""A sweep trial on Ray Train, driven directly (no Tune): rank 0's reports reach the trial with a
checkpoint of the exact state, the run is held at each report until released, a stop request
ends it gracefully (after_train, last checkpoint) with its workers and placement group gone, and
a restart from a reported checkpoint (a paused trial or a PBT fork) continues it exactly."""
import re
import shutil
import time
from pathlib import Path

import pytest
import torch

from distributed_runner.core.config import Config
from distributed_runner.tune.ray_trial import RayTrainTrialRun

pytestmark = [pytest.mark.integration, pytest.mark.slow("a sweep trial on Ray Train, stopped and restarted"),
              pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
BATCH = 8
ITERS = -(-1437 // BATCH)  # iterations per epoch: the digits train split has 1437 samples


def digits_trial_cfg(work_dir, **extra):
    """The digits example as a sweep makes a trial of it: a checkpoint at every validation."""
    cfg = Config.fromfile(ROOT / "configs" / "digits_cnn.py", cfg_options=[
        f"work_dir={work_dir}", "train_cfg.max_epochs=6", f"train_dataloader.batch_size={BATCH}",
        "default_hooks.logger.interval=50", "default_hooks.checkpoint.interval=1"])
    cfg["launcher"] = dict(type="ray", num_workers=1)
    cfg["run_name"] = "."  # as trial_config makes every trial: its folder is the run's
    cfg.update(extra)
    return cfg


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def keep(path, folder):
    """What Tune's save does with a reported file: a copy the run cannot rotate away."""
    folder.mkdir(exist_ok=True)
    return shutil.copy2(path, folder / Path(path).name)


class Cluster:
    """What a trial may leave behind: placement groups, CPUs, actors (new since the snapshot)."""

    def __init__(self, ray):
        self.ray = ray
        self.pgs = set(ray.util.placement_group_table())
        self.cpus = ray.available_resources().get("CPU", 0.0)
        # the GCS's actor table (the State API needs the dashboard, which this cluster has not)
        self.actors = set(ray._private.state.actors())

    def live_pgs(self):
        return {k: v["state"] for k, v in self.ray.util.placement_group_table().items()
                if k not in self.pgs and v["state"] != "REMOVED"}

    def cpus_back(self):
        return self.ray.available_resources().get("CPU", 0.0) >= self.cpus

    def assert_freed_within(self, seconds, since):
        # the placement group table says REMOVED before the cluster's resource view has its CPUs
        # back (seen once: removed, CPU 3 of 4, the bundle's resource still listed): both are
        # waited for, within the same deadline
        deadline = time.monotonic() + seconds
        while (self.live_pgs() or not self.cpus_back()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.live_pgs() == {}
        assert self.cpus_back(), self.ray.available_resources()
        freed = time.monotonic() - since
        new = [a for k, a in self.ray._private.state.actors().items() if k not in self.actors]
        workers = [a for a in new if a["ActorClassName"] == "RayTrainWorker"]
        assert len(workers) == 1 and workers[0]["State"] == "DEAD"
        assert all(a["State"] == "DEAD" for a in new if a["ActorClassName"] == "TrialSignal")
        return freed


def stopped_at(work_dir, reason):
    text = Path(work_dir, "logs", "run.log").read_text()
    found = re.findall(rf"stop at iteration (\d+), requested by: {re.escape(reason)}", text)
    assert found, text[-2000:]
    at = int(found[-1])  # the newest run's (a restart appends to the same log)
    last = Path(work_dir, Path(work_dir, "last_checkpoint").read_text().strip())
    assert load(last)["meta"]["iter"] == at  # after_train saved that state
    return at


def test_reports_hold_stop_gracefully_and_restart_exactly(ray_cluster, tmp_path):
    import ray

    wd, saved = tmp_path / "trial", tmp_path / "tune_saved"
    reason = "tune: trial_00001 stopped by the scheduler"
    before = Cluster(ray)
    run = RayTrainTrialRun(digits_trial_cfg(wd), "trial_00001", poll_s=0.05)
    assert run.name == "trial_00001-g1"
    t0 = time.monotonic()
    run.start()
    first = run.next_report()
    startup = time.monotonic() - t0
    assert first.metrics["epoch"] == 1 and first.metrics["iter"] == ITERS
    assert first.metrics["val/accuracy"] == first.metrics["accuracy"] > 50
    assert first.metrics["done"] is False
    assert load(first.checkpoint)["meta"]["iter"] == ITERS  # the file is the state reported
    # held: until the trial releases the report, epoch 2 does not start
    time.sleep(1.5)
    assert "Epoch(train) [2]" not in Path(wd, "logs", "run.log").read_text()
    assert not Path(wd, "epoch_2.pth").exists()
    run.resume_after_report()
    second = run.next_report()
    assert second.metrics["epoch"] == 2 and load(second.checkpoint)["meta"]["iter"] == 2 * ITERS
    paused_at = keep(second.checkpoint, saved)
    run.resume_after_report()
    third_report = run.next_report()
    third = keep(third_report.checkpoint, saved / "third")
    asked = time.monotonic()
    run.request_stop(reason)  # while held at the third report: released with the stop
    assert run.wait(60)
    held_stop = time.monotonic() - asked
    assert run.error is None and run.next_report() is None
    assert stopped_at(wd, reason) == 3 * ITERS
    held_freed = before.assert_freed_within(5, asked)

    # a restart from the second report's file (a PBT exploit or a paused trial coming back): a
    # new Train run, the repeated validation not reported, the third result exactly the same
    again = Cluster(ray)
    run = RayTrainTrialRun(digits_trial_cfg(wd, resume=str(paused_at)), "trial_00001", 0.05)
    assert run.name == "trial_00001-g2"
    run.start()
    report = run.next_report()
    assert report.metrics["epoch"] == 3 and report.metrics["accuracy"] == third_report.metrics["accuracy"]
    ours, theirs = load(report.checkpoint)["state_dict"], load(third)["state_dict"]
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    run.resume_after_report()
    asked = time.monotonic()
    run.request_stop(reason)  # while training: rank 0 polls it up mid-epoch
    assert run.wait(60)
    polled_stop = time.monotonic() - asked
    at = stopped_at(wd, reason)
    assert 3 * ITERS < at <= 4 * ITERS
    polled_freed = again.assert_freed_within(5, asked)
    print(f"\nray trial: start to first report {startup:.1f} s; stop request to fit() returned "
          f"{held_stop:.2f} s (held at a report) / {polled_stop:.2f} s (polled, stopped at "
          f"iteration {at}); to placement group removed and CPUs back {held_freed:.2f} s / "
          f"{polled_freed:.2f} s")

