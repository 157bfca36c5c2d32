"""What runs inside each Ray Train worker: build the Runner from the plain config (with the
launcher's RayReportHook, which reports every checkpoint to Ray), resume from Ray's checkpoint if
there is one — or from a newer one already persisted under the run's storage, which Ray's
controller had not registered when a worker died
(:func:`~distributed_runner.checkpoint.resume_choice.choose_restart` decides) — and train.

Ray Train has already started the process group (gloo on CPU, NCCL on GPU) when this runs, so the
Runner sees the rank and world size through :mod:`distributed_runner.core.dist` like under torchrun
and wraps the model in DDP itself.

What the worker raises reaches the driver as one line (:func:`record_failure`): its whole stack
goes to the run's log (``run_dir/logs/run.log``, each failing rank's under ``[rank r]``), Ray
gets the exception's line instead of its traceback text
(:func:`~distributed_runner.core.ray_private.short_worker_errors`: no traceback logged on every
worker, none in the controller's failure report), and the exception carries :data:`FAILURE`
(rank, line, stack, when, the log's path) to the driver, which prints a ConfigError as
``drun: error: ...`` (exit 2) and any other error as one line and one stack (exit 1).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from distributed_runner.checkpoint.resume_choice import choose_restart, file_of_reported
from distributed_runner.core import dist
from distributed_runner.core.config import Config, to_config_dict
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.log import (
    DATE_FORMAT,
    LOGGER_NAME,
    REDACTING_FILTER,
    redact_process_output,
)
from distributed_runner.core.preemption import TrainingPreempted
from distributed_runner.core.redact import redact_text
from distributed_runner.core.run_folders import run_dir
from distributed_runner.engine.config_prep import prepare_config
from distributed_runner.engine.hook_builder import with_launcher_hooks
from distributed_runner.engine.sections import settings_of
from distributed_runner.health.heartbeat import HEARTBEAT
from distributed_runner.launch.run_control import RunControl

RESTORE_DIR = "ray_restore"
FAILURE = "drun_failure"
"""The attribute of an exception a worker raised: ``{'rank', 'line', 'stack', 'at', 'log'}``
(plain values: it pickles with the exception to the driver)."""


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
    """``train_loop_per_worker`` of the TorchTrainer the Ray launcher builds: :func:`run_worker`,
    and what it raises recorded (:func:`record_failure`) before it goes to Ray."""
    from distributed_runner.core.ray_private import quiet_train_reports, short_worker_errors

    redact_process_output()  # what this worker prints reaches the driver's terminal
    short_worker_errors(failure_line)
    if not (config["cfg"].get("launcher") or {}).get("verbose"):
        quiet_train_reports()
    try:
        run_worker(config)
    except Exception as error:
        record_failure(config, error)
        raise


def run_worker(config: dict) -> None:
    """Build the Runner on this worker, resume from Ray's checkpoint (or a newer one) and
    train; for ``drun test`` (``config['command']``), test ``load_from`` and leave rank 0's
    metrics in the run's keys for the driver (run_control.py)."""
    import ray
    import ray.train
    import ray.train.torch

    from distributed_runner.engine.runner import Runner

    if config.get("env") is not None:  # the driver's MLFLOW_* (ray_connect.forwarded_env)
        os.environ.update(ray.get(config["env"]))
    cfg = Config(to_config_dict(config["cfg"])).with_source(config.get("source"))
    # every saved checkpoint is reported to Ray (RayReportHook, shown by drun hooks --launcher ray);
    # the driver's Ctrl-C reaches rank 0 through the run's keys in Ray's store (RayPauseHook)
    cfg["custom_hooks"] = [
        {**hook, "control": config.get("control")} if _is_pause_hook(hook) else hook
        for hook in with_launcher_hooks(cfg.get("custom_hooks"), "ray")
    ]
    ctx = ray.train.get_context()
    cfg["device"] = str(ray.train.torch.get_device())
    testing = config.get("command") == "test"  # drun test: load_from, never a resume
    rank = ctx.get_world_rank()
    restored, why = (None, None) if testing else choose_restart_checkpoint(cfg, rank)
    if restored is not None:
        cfg["resume"] = restored
    cfg, _ = prepare_config(cfg)  # once: the Runner reads these settings, not its own parse
    settings = settings_of(cfg)
    assert settings is not None, "prepare_config attaches the settings"
    # the Runner's build is watched too (phase 'setup'): a dataset or model that stalls while
    # it is built (a network file system, a lock) is named by the hang watch like any hang
    HEARTBEAT.begin(settings.watchdog)
    runner = Runner.from_cfg(cfg)
    for note in config.get("notes") or ():  # the driver's iMIX translations
        runner.logger.info(note)
    if why is not None:
        runner.logger.warning(why)
    elif restored is not None:
        runner.logger.info("Ray restored checkpoint %s", restored)
    if testing:  # every rank has the same metrics (the evaluator gathers them): rank 0's
        metrics = runner.test()
        if rank == 0 and config.get("control") is not None:
            RunControl(config["control"]).tested(metrics)
        return
    try:
        runner.train()
    except TrainingPreempted as stopped:
        if not stopped.interrupted or config.get("control") is None:
            raise  # a preemption signal: Ray restarts the group (max_failures)
        if ctx.get_world_rank() == 0:  # the driver reads where the run stopped
            RunControl(config["control"]).paused(stopped.iteration, str(stopped.checkpoint))


def _is_pause_hook(hook: Any) -> bool:
    return isinstance(hook, dict) and hook.get("type") == "RayPauseHook"


# -- a worker's failure -----------------------------------------------------------------------
def failure_line(error: BaseException) -> str | None:
    """What Ray shows of an exception :func:`record_failure` recorded (None: one it did not)."""
    failure = getattr(error, FAILURE, None)
    return failure.get("line") if isinstance(failure, dict) else None


def one_line(error: BaseException) -> str:
    """``key: message`` for a ConfigError (as ``drun`` prints it), else ``Type: message`` (its
    first line; the stack has all of it)."""
    if isinstance(error, ConfigError):
        return str(error)
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def record_failure(config: dict, error: BaseException) -> None:
    """``error``'s whole stack to the run's log, and :data:`FAILURE` on ``error`` for the driver.
    Never raises: the error itself goes on to Ray whatever happens here."""
    try:
        rank = _world_rank()
        cfg = config["cfg"]
        log = run_dir(cfg["work_dir"], cfg.get("run_name")) / "logs" / "run.log"
        stack = redact_text("".join(traceback.format_exception(error)))
        line = redact_text(one_line(error))
        setattr(
            error,
            FAILURE,
            {"rank": rank, "line": line, "stack": stack, "at": time.time(), "log": str(log)},
        )
        _log_stack(log, rank, f"training failed on this worker: {line}\n{stack.rstrip()}")
    except Exception:  # noqa: BLE001 - a read-only folder, an exception without __dict__
        pass


def _world_rank() -> int:
    """This worker's rank in Ray Train's group (the process group's outside one)."""
    try:
        import ray.train

        return int(ray.train.get_context().get_world_rank())
    except Exception:  # noqa: BLE001 - not in a Ray Train worker
        return dist.get_rank()


def _log_stack(log: Path, rank: int, text: str) -> None:
    """``text`` at ERROR into ``log`` only, never the terminal: through the run logger's own file
    handler when it writes there (rank 0 once the Runner is built), else a handler of its own."""
    logger = logging.getLogger(LOGGER_NAME)
    record = logger.makeRecord(LOGGER_NAME, logging.ERROR, __file__, 0, text, (), None)
    ours = [
        h
        for h in logger.handlers
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename).resolve() == log.resolve()
    ]
    if ours:
        for handler in ours:
            handler.handle(record)
            handler.flush()
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log)
    prefix = f"[rank {rank}] " if rank else ""
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(message)s", datefmt=DATE_FORMAT)
    )
    handler.addFilter(REDACTING_FILTER)
    try:
        handler.handle(record)
    finally:
        handler.close()
