"""val_cfg=dict(mode='async') through Ray Train: due checkpoints are reported with
``validation=`` and validated by Ray Train's validation tasks on a CPU beside the training
worker; rank 0 reads the results back and logs them at the checkpoint's step — the same values as
in-loop validation — and the launcher refuses, in one line, a cluster that leaves validation no
CPU."""
import json
from pathlib import Path

import pytest
import torch

from distributed_runner import Runner
from distributed_runner.core.errors import ConfigError
from distributed_runner.launch.launcher import RayLauncher, normalize_launcher
from tests.toy import base_cfg

pytestmark = [pytest.mark.integration, pytest.mark.slow("Ray Train runs with validation tasks beside the workers"),
              pytest.mark.timeout(240)]

VAL = dict(dataset=dict(type="ToyDataset", n=60, seed=1), batch_size=8,
           sampler=dict(type="DefaultSampler", shuffle=False))


def cfg(work_dir: Path, **overrides) -> dict:
    out = base_cfg(work_dir, custom_imports=dict(imports=["tests.toy"]), val_dataloader=VAL,
                   optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
                   default_hooks=dict(logger=dict(type="LoggerHook", interval=5, sinks=["jsonl"]),
                                      checkpoint=dict(type="CheckpointHook", interval=1,
                                                      max_keep_ckpts=1, save_best="accuracy")))
    out.update(overrides)
    return out


def val_records(work_dir: Path) -> list[tuple[int, int, float]]:
    lines = (work_dir / "logs" / "scalars.jsonl").read_text().splitlines()
    return sorted((r["step"], r["epoch"], r["accuracy"]) for r in map(json.loads, lines)
                  if r["mode"] == "val")


def test_ray_validation_tasks_log_inline_metrics_at_checkpoint_steps(ray_cluster, tmp_path):
    inline = Runner.from_cfg(cfg(tmp_path / "inline"))
    inline.train()
    expected = val_records(tmp_path / "inline")
    assert [s for s, _, _ in expected] == [10, 20, 30]

    async_cfg = cfg(tmp_path / "ray", val_cfg=dict(mode="async", resources=dict(CPU=1)),
                    launcher=dict(type="ray", num_workers=1))
    result = RayLauncher(async_cfg, normalize_launcher(async_cfg["launcher"])).fit()
    assert val_records(tmp_path / "ray") == expected
    # Ray's own record of the validated checkpoints carries the same values
    validated = sorted((m["iter"], m["async_val/accuracy"]) for _, m in result.best_checkpoints
                       if "async_val/accuracy" in m)
    assert validated == [(s, a) for s, _, a in expected]
    best = max(expected, key=lambda r: r[2])  # the first of the best, as save_best keeps it
    assert (tmp_path / "ray" / f"best_accuracy_epoch_{best[1]}.pth").is_file()


def test_launcher_refuses_a_cluster_without_a_cpu_for_validation(ray_cluster, tmp_path):
    total = int(ray_cluster.cluster_resources()["CPU"])
    bad = cfg(tmp_path, val_cfg=dict(mode="async"), launcher=dict(type="ray", num_workers=total))
    with pytest.raises(ConfigError) as e:
        RayLauncher(bad, normalize_launcher(bad["launcher"])).fit()
    assert str(e.value).startswith("val_cfg.resources: asynchronous validation needs 1 CPU")
    assert "\n" not in str(e.value)


def test_ray_restart_mid_run_decides_and_ends_as_an_uninterrupted_run(ray_cluster, tmp_path):
    """The training worker dies once at iteration 25 (max_failures=1): Ray restarts the group from
    its last checkpoint, the validations the checkpoint had not applied come back from Ray's
    queue, and early stopping, the metrics and the final weights are the uninterrupted run's."""
    hooks = dict(logger=dict(type="LoggerHook", interval=5, sinks=["jsonl"]),
                 checkpoint=dict(type="CheckpointHook", interval=2, max_keep_ckpts=1,
                                 save_best="accuracy"))
    stop = dict(type="EarlyStoppingHook", monitor="accuracy", patience=1, min_delta=0.5)
    base = dict(custom_imports=dict(imports=["tests.toy", "tests.async_val_probes"]),
                val_cfg=dict(mode="async"), default_hooks=hooks,
                train_cfg=dict(by_epoch=True, max_epochs=8, val_interval=1))
    reference = Runner.from_cfg(cfg(tmp_path / "reference", custom_hooks=[stop], **base))
    reference.train()
    ray = cfg(tmp_path / "ray", custom_hooks=[stop, dict(type="DieAtHook", iters=(25,))],
              launcher=dict(type="ray", num_workers=1, max_failures=1), **base)
    RayLauncher(ray, normalize_launcher(ray["launcher"])).fit()
    assert (tmp_path / "ray" / "died_at_25").exists()
    # a result applied before the death and again after the restart is logged twice, the same
    records = val_records(tmp_path / "ray")
    assert len({s for s, _, _ in records}) == len(set(records)) < len(records)
    assert sorted(set(records)) == val_records(tmp_path / "reference")
    assert max(s for s, _, _ in records) == 50  # early stopping stopped where it did
    weights = [torch.load(d / "iter_50.pth", weights_only=True)["state_dict"]
               for d in (tmp_path / "ray", tmp_path / "reference")]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
