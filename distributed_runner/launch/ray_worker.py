"""What runs inside each Ray Train worker: build the Runner from the plain config (with the
launcher's RayReportHook, which reports every checkpoint to Ray), resume from Ray's checkpoint if
there is one — or from a newer one already persisted under the run's storage, which Ray's
controller had not registered when a worker died
(:func:`~distributed_runner.checkpoint.resume_choice.choose_restart` decides) — and train.

Ray Train has already started the process group (gloo on CPU, NCCL on GPU) when this runs, so the
Runner sees the rank and world size through :mod:`distributed_runner.core.dist` like under torchrun
and wraps the model in DDP itself.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from distributed_runner.checkpoint.resume_choice import choose_restart, file_of_reported
from distributed_runner.core.config import Config, to_config_dict
from distributed_runner.core.log import redact_process_output
from distributed_runner.core.preemption import TrainingPreempted
from distributed_runner.core.run_folders import run_dir
from distributed_runner.engine.hook_builder import with_launcher_hooks
from distributed_runner.health.heartbeat import HEARTBEAT
from distributed_runner.health.watchdog import parse_watchdog

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
    return str(file_of_reported(local, checkpoint.path))


def choose_restart_checkpoint(cfg: dict, rank: int) -> tuple[str | None, str | None]:
    """The checkpoint a (re)started worker group resumes from, the same on every rank, and why
    when it is not Ray's: Ray's, copied here, or what
    :func:`~distributed_runner.checkpoint.resume_choice.choose_restart` prefers to it."""
    restored = restore_from_ray(str(run_dir(cfg["work_dir"], cfg.get("run_name"))), rank)
    return choose_restart(restored, cfg.get("launcher") or {}, rank)


def train_worker(config: dict) -> None:
    """``train_loop_per_worker`` of the TorchTrainer the Ray launcher builds."""
    import ray
    import ray.train
    import ray.train.torch

    from distributed_runner.engine.runner import Runner

    redact_process_output()  # what this worker prints reaches the driver's terminal
    if not (config["cfg"].get("launcher") or {}).get("verbose"):
        from distributed_runner.core.ray_private import quiet_train_reports

        quiet_train_reports()
    if config.get("env") is not None:  # the driver's MLFLOW_* (ray_connect.forwarded_env)
        os.environ.update(ray.get(config["env"]))
    cfg = Config(to_config_dict(config["cfg"])).with_source(config.get("source"))
    # every saved checkpoint is reported to Ray (RayReportHook, shown by drun hooks --launcher ray);
    # the driver's Ctrl-C reaches rank 0 through the run's control actor (RayPauseHook)
    cfg["custom_hooks"] = [
        {**hook, "control": config.get("control")} if _is_pause_hook(hook) else hook
        for hook in with_launcher_hooks(cfg.get("custom_hooks"), "ray")
    ]
    ctx = ray.train.get_context()
    cfg["device"] = str(ray.train.torch.get_device())
    restored, why = choose_restart_checkpoint(cfg, ctx.get_world_rank())
    if restored is not None:
        cfg["resume"] = restored
    # the Runner's build is watched too (phase 'setup'): a dataset or model that stalls while
    # it is built (a network file system, a lock) is named by the hang watch like any hang
    HEARTBEAT.begin(parse_watchdog(cfg.get("watchdog")))
    runner = Runner.from_cfg(cfg)
    if why is not None:
        runner.logger.warning(why)
    elif restored is not None:
        runner.logger.info("Ray restored checkpoint %s", restored)
    try:
        runner.train()
    except TrainingPreempted as stopped:
        if not stopped.interrupted or config.get("control") is None:
            raise  # a preemption signal: Ray restarts the group (max_failures)
        if ctx.get_world_rank() == 0:  # the driver reads where the run stopped
            control = ray.get_actor(config["control"])
            ray.get(control.paused.remote(stopped.iteration, str(stopped.checkpoint)))


def _is_pause_hook(hook: Any) -> bool:
    return isinstance(hook, dict) and hook.get("type") == "RayPauseHook"
