"""Requests, early stopping and the NaN policy under 2 real Ray Train workers, each raised on one
rank only: both ranks must act on the same iteration and nothing may hang."""
import json
from pathlib import Path

import pytest

from tests.integration.test_ray_train import fit, ray_cfg

pytestmark = [pytest.mark.integration, pytest.mark.slow("Ray Train runs on 2 workers"),
              pytest.mark.timeout(240)]


def test_one_rank_requests_nan_skip_and_early_stopping_under_ray(ray_cluster, tmp_path):
    cfg = ray_cfg(
        tmp_path, model=dict(type="NanModel", nan_at=[3], nan_rank=1),
        custom_imports=dict(imports=["tests.ray_probe", "tests.hook_probes"]),
        train_cfg=dict(by_epoch=True, max_epochs=8),
        val_evaluator=dict(type="SeqMetric", values=[0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]),
        default_hooks=dict(logger=dict(type="LoggerHook", interval=5, sinks=["jsonl"]),
                           checkpoint=dict(type="CheckpointHook", interval=-1)),
        custom_hooks=[dict(type="NonFiniteLossHook", policy="skip"),
                      dict(type="RequestHook", kind="checkpoint", at_iter=4, rank=1),
                      dict(type="RequestHook", kind="val", at_iter=7, rank=0),
                      dict(type="EarlyStoppingHook", monitor="score", rule="greater", patience=2,
                           min_delta=0.01),
                      dict(type="ControlDumpHook")])
    status, launcher, _ = fit(cfg)
    assert status == 0
    r0, r1 = (json.loads((tmp_path / f"control_rank{r}.json").read_text()) for r in (0, 1))
    # 20 samples per rank, batch 4: 5 iterations an epoch. Scores 0.5, 0.6 (epoch 1 and the
    # requested validation at iteration 7), then 0.6 twice: stop after the 4th validation
    assert r0["iter"] == r1["iter"] == 15
    acted = [[i, k] for i, k, _ in r0["log"]]
    # agree_every='auto' agrees after every iteration while it times the first 20; the stop
    # comes from a validation
    assert acted == [[i, k] for i, k, _ in r1["log"]] == [[4, "checkpoint"], [7, "val"],
                                                          [15, "stop"]]
    assert r0["log"][0][2] == ["test checkpoint at 4 (rank 1)"]
    assert r1["log"][1][2] == ["test val at 7 (rank 0)"]
    assert r0["events"] == r1["events"] == 1  # rank 1's NaN: both ranks skipped the step
    assert r0["weights"] == r1["weights"]
    # the requested checkpoint was written once (rank 0) and reported to Ray by both ranks
    assert (tmp_path / "iter_4.pth").is_file()
    storage = Path(launcher.storage_path) / launcher.name
    reported = sorted(p.name.rsplit("-", 1)[0] for p in storage.iterdir() if p.is_dir())
    assert reported == ["iter_4", "last"]
