"""What runs inside each Ray Train worker: build the Runner from the plain config (with the
launcher's RayReportHook, which reports every checkpoint to Ray), resume from Ray's checkpoint if
there is one — or from a newer one already persisted under the run's storage, which Ray's
controller had not registered when a worker died — and train.

Ray Train has already started the process group (gloo on CPU, NCCL on GPU) when this runs, so the
Runner sees the rank and world size through :mod:`distributed_runner.dist` like under torchrun and
wraps the model in DDP itself.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from . import dist
from .checkpoint import CheckpointDamaged, load_file
from .config import Config, to_config_dict
from .hook_builder import with_launcher_hooks
from .resume_choice import ranked_checkpoints

RESTORE_DIR = "ray_restore"


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


def newest_persisted(storage: str, name: str, than_iter: int) -> Path | None:
    """The newest checkpoint reported under ``storage/name`` that is newer than iteration
    ``than_iter`` and verifies, or None. Ray hands a restarted group the checkpoint its
    controller registered last; a worker killed right after a report can leave a newer one
    persisted there that the controller never learned of. Local (or mounted) storage only."""
    folder = Path(storage) / name
    if "://" in storage or not folder.is_dir():
        return None
    for iteration, path in ranked_checkpoints(folder.glob("*/*.pth")):
        if iteration <= than_iter:  # unreadable files rank at -1: never chosen
            break
        try:
            load_file(path, "resume")  # verified against the checksum reported with it
            return path
        except CheckpointDamaged:
            continue  # a torn upload
    return None


def choose_restart_checkpoint(cfg: dict, rank: int) -> tuple[str | None, str | None]:
    """The checkpoint a (re)started worker group resumes from, the same on every rank, and why
    when it is not Ray's: Ray's, or a newer one already persisted under the run's storage (rank 0
    looks; every rank must be able to read it, else Ray's is kept)."""
    restored = restore_from_ray(cfg["work_dir"], rank)
    launcher = cfg.get("launcher") or {}
    newer = None
    if rank == 0 and launcher.get("storage_path") and launcher.get("name"):
        ranked = ranked_checkpoints([Path(restored)]) if restored else []
        ray_iter = ranked[0][0] if ranked else -1
        found = newest_persisted(launcher["storage_path"], launcher["name"], ray_iter)
        newer = str(found) if found is not None else None
    newer = dist.broadcast_object(newer)
    if newer is not None:
        readable = torch.tensor([1 if Path(newer).is_file() else 0])
        if int(dist.all_reduce(readable, "min").item()) == 1:
            handed = Path(restored).name if restored else "no checkpoint"
            return newer, (f"Ray handed back {handed}; resuming from {newer} instead: it is "
                           f"newer and verifies (its report had not reached Ray's controller "
                           f"when a worker died)")
    return restored, None


def train_worker(config: dict) -> None:
    """``train_loop_per_worker`` of the TorchTrainer the Ray launcher builds."""
    import ray
    import ray.train
    import ray.train.torch

    from .runner import Runner

    if config.get("env") is not None:  # the driver's MLFLOW_* (ray_connect.forwarded_env)
        os.environ.update(ray.get(config["env"]))
    cfg = Config(to_config_dict(config["cfg"])).with_source(config.get("source"))
    # every saved checkpoint is reported to Ray (RayReportHook, shown by drun hooks --launcher ray)
    cfg["custom_hooks"] = with_launcher_hooks(cfg.get("custom_hooks"), "ray")
    ctx = ray.train.get_context()
    cfg["device"] = str(ray.train.torch.get_device())
    restored, why = choose_restart_checkpoint(cfg, ctx.get_world_rank())
    if restored is not None:
        cfg["resume"] = restored
    runner = Runner.from_cfg(cfg)
    if why is not None:
        runner.logger.warning(why)
    elif restored is not None:
        runner.logger.info("Ray restored checkpoint %s", restored)
    runner.train()
