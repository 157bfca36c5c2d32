"""The training state a checkpoint holds, gathered from and given back to a Runner.

Everything here is per run (model, optimizer, schedulers, scaler, MessageHub, hook states) or per
rank (RNG, sampler position, BN buffers between syncs, gradients of an unfinished accumulation
window). Per-rank parts are gathered from every rank, so both functions run on every rank; only
rank 0 writes the result. The layout is documented in :mod:`distributed_runner.checkpoint`.
"""
from __future__ import annotations

import platform
import time
from pathlib import Path
from typing import Any

import torch

from . import __version__, dist
from .checkpoint import capture_rng, load_weights, model_state_from, restore_rng
from .config import dumps_json
from .redact import redact
from .sharded_checkpoint import SHARDED, load_shards
from .sharding import full_model_state, full_optimizer_state, is_sharded, \
    load_full_optimizer_state


def load_model_weights(runner: Any, ckpt: dict, path: str | Path, key: str,
                       strict: bool = True) -> None:
    """The checkpoint's weights into ``runner.model``: from its shards or its ``state_dict``."""
    if SHARDED in ckpt:
        load_shards(runner, ckpt, Path(path), with_optimizer=False)
    else:
        load_weights(runner.model, model_state_from(ckpt), key, path, strict=strict)


def collect_training_state(runner: Any, save_optimizer: bool, save_param_scheduler: bool,
                           meta: dict | None, with_weights: bool = True) -> dict:
    """The checkpoint dict for ``runner``'s current position (collective: call on every rank).
    Without ``with_weights`` the model and optimizer are left out (sharded FSDP checkpoints
    write them as shards, :mod:`.sharded_checkpoint`)."""
    position = runner.train_state.position() if runner.train_loop is not None else {}
    info = {**position, "seed": runner.seed, "world_size": runner.world_size,
            "experiment_name": runner.experiment_name, "time": time.time(),
            "config": dumps_json(redact(runner.cfg)),
            "versions": {"distributed_runner": __version__, "torch": str(torch.__version__),
                         "python": platform.python_version()}}
    info.update(meta or {})
    sampler_pos = {"epoch": position.get("epoch", 0),
                   "iter_in_epoch": position.get("iter_in_epoch", 0)}
    ckpt: dict[str, Any] = {
        "meta": info,
        "message_hub": runner.message_hub.state_dict(),
        "hooks": {name: hook.state_dict() for name, hook in runner.stateful_hooks().items()},
        "sinks": runner.sinks.state_dict(),
        "rng": {"ranks": dist.all_gather_object(capture_rng())},
        "sampler": {"ranks": dist.all_gather_object(sampler_pos)},
    }
    if with_weights:  # FSDP with checkpoint='full': gathered on rank 0, an unsharded model's keys
        ckpt["state_dict"] = full_model_state(runner.model) if is_sharded(runner.model) \
            else runner.model.state_dict()
    if runner.optim_wrapper is not None:
        if save_optimizer and with_weights:
            ckpt["optimizer"] = full_optimizer_state(runner.model, runner.optim_wrapper.optimizer) \
                if is_sharded(runner.model) else runner.optim_wrapper.state_dict()
        ckpt["scaler"] = runner.optim_wrapper.scaler_state_dict()
        pending = runner.optim_wrapper.pending_grads(runner.model)
        if pending is not None:  # saved inside a gradient-accumulation window
            ckpt["accumulated_grads"] = {"ranks": dist.all_gather_object(pending)}
    if runner.world_size > 1:
        # buffers (BN statistics) drift apart between syncs: each rank resumes with its own
        ckpt["rank_buffers"] = {"ranks": dist.all_gather_object(
            {n: b.detach().cpu().clone() for n, b in runner.model.named_buffers()})}
    if save_param_scheduler:
        ckpt["param_schedulers"] = [s.state_dict() for s in runner.param_schedulers]
    return ckpt


def restore_training_state(runner: Any, ckpt: dict, path: str | Path) -> None:
    """Give ``runner`` back the state in ``ckpt``; each rank takes its own per-rank parts."""
    meta = ckpt["meta"]
    if SHARDED in ckpt:  # model and optimizer from the shards, resharded to this run's ranks
        load_shards(runner, ckpt, Path(path), with_optimizer=True)
    else:
        load_weights(runner.model, model_state_from(ckpt), "resume", path)
    if runner.optim_wrapper is not None:
        if "optimizer" in ckpt.get(SHARDED, {}).get("keys", ()):
            pass  # loaded with the model
        elif "optimizer" in ckpt and is_sharded(runner.model):
            load_full_optimizer_state(runner.model, runner.optim_wrapper.optimizer,
                                      ckpt["optimizer"])
        elif "optimizer" in ckpt:
            runner.optim_wrapper.load_state_dict(ckpt["optimizer"])
        else:
            runner.logger.warning("%s has no optimizer state (save_optimizer=False): the "
                                  "optimizer starts fresh", path)
        runner.optim_wrapper.load_scaler_state_dict(ckpt.get("scaler"))
    states = ckpt.get("param_schedulers", [])
    if len(states) == len(runner.param_schedulers):
        for sched, state in zip(runner.param_schedulers, states):
            sched.load_state_dict(state)
    else:
        runner.logger.warning("%s has %d scheduler states for %d schedulers: schedulers start "
                              "fresh", path, len(states), len(runner.param_schedulers))
    runner.message_hub.load_state_dict(ckpt.get("message_hub", {}))
    hooks = runner.stateful_hooks()
    for name, state in ckpt.get("hooks", {}).items():
        if name in hooks and hasattr(hooks[name], "load_state_dict"):
            hooks[name].load_state_dict(state)
    # sinks' state (the MLflow run id); checkpoints from before sinks were the Runner's kept it
    # in LoggerHook's state
    old = ckpt.get("hooks", {}).get("logger")
    runner.sinks.load_state_dict(ckpt.get("sinks") or (old or {}).get("sinks") or [])
    same_world = int(meta.get("world_size", 1)) == runner.world_size
    if runner.train_loop is not None:
        position = dict(meta)
        sampler_state = ckpt.get("sampler", {}).get("ranks")
        if same_world and sampler_state:
            position["iter_in_epoch"] = sampler_state[runner.rank]["iter_in_epoch"]
        runner.train_loop.resume_from(position)
    rank_buffers = ckpt.get("rank_buffers", {}).get("ranks")
    if same_world and rank_buffers:
        mine = rank_buffers[runner.rank]
        for name, buf in runner.model.named_buffers():
            if name in mine:
                buf.copy_(mine[name])
    grads = ckpt.get("accumulated_grads", {}).get("ranks")
    if grads and runner.optim_wrapper is not None:
        if same_world:
            runner.optim_wrapper.restore_pending_grads(runner.model, grads[runner.rank])
        else:
            runner.logger.warning("%s was saved inside a gradient-accumulation window with "
                                  "another world size: the window's gradients are dropped", path)
    rng_ranks = ckpt.get("rng", {}).get("ranks")
    if same_world and rng_ranks:
        restore_rng(rng_ranks[runner.rank])
    elif rng_ranks:
        runner.logger.warning("%s was saved with %s ranks, this run has %d: random states are "
                              "not restored (the run continues, not bit-exactly)", path,
                              meta.get("world_size"), runner.world_size)


def load_or_resume(runner: Any, load_from: Any, resume: Any) -> None:
    """The Runner's start: ``resume='path'`` (that file, verified, no second-guessing), else
    ``resume=True`` (the newest checkpoint of work_dir that verifies; none yet: start fresh),
    else ``load_from`` (weights only)."""
    from .resume_choice import choose_checkpoint

    if isinstance(resume, (str, Path)):
        runner.resume(resume)
        return
    if resume:
        path, ckpt = choose_checkpoint(runner.work_dir, runner.logger)
        if path is not None:
            runner.resume(path, ckpt)
            return
        runner.logger.info("resume=True but %s has no checkpoint yet: starting fresh",
                           runner.work_dir)
    if load_from:
        runner.load_checkpoint(load_from)


def newest_checkpoint_everywhere(runner: Any, reason: str) -> tuple[dict, str]:
    """The newest checkpoint that verifies (:func:`~.resume_choice.choose_checkpoint`) and its
    path on every rank: rank 0 reads the file and broadcasts it, so ranks on other machines need
    not see ``work_dir``."""
    from .resume_choice import choose_checkpoint

    path, ckpt = choose_checkpoint(runner.work_dir, runner.logger, "rollback") \
        if runner.rank == 0 else (None, None)
    path = dist.broadcast_object(str(path or "") if runner.rank == 0 else None)
    if not path:
        raise FloatingPointError(f"cannot roll back ({reason}): no checkpoint saved yet; "
                                 f"save earlier (default_hooks.checkpoint.interval) or use "
                                 f"policy='skip'")
    return dist.broadcast_object(ckpt), path
