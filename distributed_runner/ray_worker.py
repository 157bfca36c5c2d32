"""What runs inside each Ray Train worker: build the Runner from the plain config, resume from
Ray's checkpoint if there is one, train, and report every checkpoint to Ray.

Ray Train has already started the process group (gloo on CPU, NCCL on GPU) when this runs, so the
Runner sees the rank and world size through :mod:`distributed_runner.dist` like under torchrun and
wraps the model in DDP itself.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from .config import Config, import_custom_modules, to_config_dict

RESTORE_DIR = "ray_restore"


def report_checkpoint(runner: Any, path: Path, meta: dict) -> None:
    """Report a checkpoint the runner just wrote: rank 0 passes it, the others report None.

    ``ray.train.report`` is a barrier: every rank calls it once per saved checkpoint, which the
    runner guarantees by saving at the same points on every rank. The metrics are the position and
    the latest validation results, so Ray's result table reads like the run's log.
    """
    import ray.train

    metrics: dict[str, Any] = {"epoch": meta.get("epoch"), "iter": meta.get("iter"),
                               "checkpoint": path.name}
    for key, buf in runner.message_hub.log_scalars.items():
        if key.startswith("val/") and len(buf):
            metrics[key] = buf.current()
    if runner.rank != 0:
        ray.train.report(metrics, checkpoint=None)
        return
    with tempfile.TemporaryDirectory(prefix="drun-report-") as tmp:
        target = Path(tmp) / path.name
        try:
            os.link(path, target)  # same filesystem: no copy before Ray persists it
        except OSError:
            shutil.copy2(path, target)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp),
                         checkpoint_dir_name=f"{path.stem}-{time.time_ns()}")


def restore_from_ray(work_dir: str, rank: int) -> str | None:
    """The checkpoint Ray hands a (re)started worker group, copied to local disk, or None."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return None
    local = Path(work_dir) / RESTORE_DIR / f"rank{rank}"
    shutil.rmtree(local, ignore_errors=True)
    checkpoint.to_directory(str(local))
    files = sorted(local.glob("*.pth"))
    if len(files) != 1:
        raise RuntimeError(f"Ray checkpoint {checkpoint.path} holds {len(files)} .pth files, "
                           f"expected one")
    return str(files[0])


def train_worker(config: dict) -> None:
    """``train_loop_per_worker`` of the TorchTrainer the Ray launcher builds."""
    import ray.train
    import ray.train.torch

    from .runner import Runner

    cfg = Config(to_config_dict(config["cfg"]))
    import_custom_modules(cfg.get("custom_imports"))
    ctx = ray.train.get_context()
    cfg["device"] = str(ray.train.torch.get_device())
    restored = restore_from_ray(cfg["work_dir"], ctx.get_world_rank())
    if restored is not None:
        cfg["resume"] = restored
    runner = Runner.from_cfg(cfg)
    runner.checkpoint_callbacks.append(report_checkpoint)
    if restored is not None:
        runner.logger.info("Ray restored checkpoint %s", restored)
    runner.train()
