"""What a checkpoint holds: every part declared once, in :data:`PARTS`.

Each :class:`~.types.Part` says what its key holds, whether every rank keeps its own
(``per_rank``: the value is gathered from all ranks as ``{"ranks": [rank 0's, rank 1's, ...]}``),
when it is there, who writes it, and how it is collected and restored. The table drives saving
(:func:`~.state.collect_training_state`), restoring
(:func:`~.state.restore_training_state`), the keys CheckpointHook may publish
(:data:`PUBLISHABLE_KEYS`) and the layout in :mod:`distributed_runner.checkpoint.files`'s docstring
(:func:`layout_text`; a test checks the two agree). Parts a hook writes are declared here too,
without functions: the hook collects and restores them itself.

The table's order is the order parts are collected and restored. It matters for restoring: the
weights before the per-rank buffers that override them, the optimizer before the gradients of an
unfinished accumulation window, the random states last (nothing after them draws a number).

Collect and restore functions receive a :class:`~.types.CheckpointSubject` — the
things they act on, read from the Runner in one place (``CheckpointSubject.of``) — never the
Runner itself.
"""

from __future__ import annotations

import platform
import textwrap
import time
from pathlib import Path
from typing import Any

import torch

from distributed_runner.checkpoint.files import load_weights, model_state_from
from distributed_runner.checkpoint.sharded import SHARDED, TRAINABLE, load_shards
from distributed_runner.checkpoint.types import (
    ABSENT,
    CheckpointSubject,
    LoadContext,
    Part,
    SaveOptions,
)
from distributed_runner.core import dist
from distributed_runner.core.config import dumps_json
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.randomness import capture_rng, restore_rng
from distributed_runner.core.redact import redact
from distributed_runner.model.sharding import (
    full_model_state,
    full_optimizer_state,
    is_sharded,
    load_full_optimizer_state,
    load_local_training_state,
)
from distributed_runner.parallel.pipeline import (
    gathered_optimizer,
    gathered_weights,
    load_stage_optimizer,
    load_stage_weights,
)
from distributed_runner.version import __version__


def saved_mesh(meta: dict) -> list[int]:
    """The checkpoint's ``(dp_replicate, dp_shard, tp)``; older ones, without the key, were
    written by DDP or plain FSDP: ``(1, world, 1)``."""
    return list(meta.get("mesh") or (1, int(meta.get("world_size", 1)), 1))


# this rank's slices of a sharded model and its optimizer, as a healing peer receives them
RANK_SLICES = "rank_slices"


def _ranks(ckpt: dict, key: str) -> list | None:
    return ckpt.get(key, {}).get("ranks")


# -- collect ------------------------------------------------------------------------------------
def _collect_meta(s: CheckpointSubject, o: SaveOptions) -> dict:
    position = s.position()
    offset = position.pop("epoch_offset", 0)
    info = {
        **position,
        # the data pass's sample position: a resume with a new global batch goes on from it
        "samples_in_epoch": (
            position["iter_in_epoch"] * s.global_batch + offset
            if s.global_batch is not None and "iter_in_epoch" in position
            else None
        ),
        "seed": s.seed,
        "world_size": s.world_size,
        "mesh": list(dist.mesh_layout()),  # (dp_replicate, dp_shard, tp): per-rank parts fit it
        # samples an iteration trained, all ranks together: a resume at another world size keeps
        # it (data/world_change.py); None when the loader does not say
        "global_batch": s.global_batch,
        "num_streams": s.num_streams,  # a streamed order's C: a resume keeps it
        # train_dataloader.batch_size as configured: one that differs at the resume asks for a
        # new global batch (data/world_change.py)
        "batch_size": s.batch_size,
        "experiment_name": s.experiment_name,
        "time": time.time(),
        "config": dumps_json(redact(s.cfg)),
        "versions": {
            "distributed_runner": __version__,
            "torch": str(torch.__version__),
            "python": platform.python_version(),
        },
    }
    if s.pretrained_from:  # export's tokenizer files and a trainable-only resume's base
        info["pretrained_from"] = s.pretrained_from
    info.update(o.meta or {})
    return info


def _collect_weights(s: CheckpointSubject, o: SaveOptions) -> Any:
    if not o.with_weights:  # sharded: in the shards
        return ABSENT
    # FSDP with checkpoint='full': gathered on rank 0, an unsharded model's keys; pipeline
    # stages: gathered on rank 0 under their full names (the one-process checkpoint)
    if s.pipeline is not None:
        state = gathered_weights(s.model, s.pipeline.plan)
    else:
        state = full_model_state(s.model) if is_sharded(s.model) else s.model.state_dict()
    if (o.meta or {}).get("weights") == TRAINABLE:  # the frozen rest: load_from's directory
        frozen = frozen_names(s.model)
        state = {k: v for k, v in state.items() if k not in frozen}
    return state


def frozen_names(model: Any) -> set[str]:
    """The state_dict names of parameters that do not train (every name of a tied one)."""
    return {
        name for name, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad
    }


def _collect_optimizer(s: CheckpointSubject, o: SaveOptions) -> Any:
    if s.optim_wrapper is None or not (o.save_optimizer and o.with_weights):
        return ABSENT
    if s.pipeline is not None:
        return gathered_optimizer(s.model, s.optim_wrapper.optimizer, s.pipeline.plan)
    return (
        full_optimizer_state(s.model, s.optim_wrapper.optimizer)
        if is_sharded(s.model)
        else s.optim_wrapper.state_dict()
    )


def _collect_window_grads(s: CheckpointSubject, o: SaveOptions) -> Any:
    grads = s.optim_wrapper.pending_grads(s.model) if s.optim_wrapper is not None else None
    return ABSENT if grads is None else grads  # None: saved at a window boundary


def _collect_buffers(s: CheckpointSubject, o: SaveOptions) -> Any:
    if s.world_size == 1:
        return ABSENT
    return {n: b.detach().cpu().clone() for n, b in s.model.named_buffers()}


def _collect_sampler(s: CheckpointSubject, o: SaveOptions) -> dict:
    position = s.position()
    return {"epoch": position.get("epoch", 0), "iter_in_epoch": position.get("iter_in_epoch", 0)}


# -- restore ------------------------------------------------------------------------------------
def _restore_weights(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    if SHARDED in ckpt or RANK_SLICES in ckpt:
        return
    state = model_state_from(ckpt)
    if s.pipeline is not None:  # this rank's stages of the whole model's weights
        load_stage_weights(s.model, state, c.path)
        return
    if ckpt["meta"].get("weights") != TRAINABLE:
        load_weights(s.model, state, "resume", c.path)
        return
    require_base(s, ckpt, c)
    frozen = frozen_names(s.model)
    lacking = [k for k in s.model.state_dict() if k not in state and k not in frozen]
    if lacking:
        raise ConfigError(
            "resume",
            f"{c.path} holds the trainable weights only, and not {lacking[0]}, which "
            f"trains in this model: is it a checkpoint of this config?",
        )
    load_weights(s.model, state, "resume", c.path, strict=False)  # the rest: load_from's


def require_base(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    """A checkpoint without its frozen weights resumes only onto the model directory that gave
    them (else the base would be the model's random initialisation)."""
    recorded = ckpt["meta"].get("pretrained_from")
    if not s.pretrained_from:
        raise ConfigError(
            "resume",
            f"{c.path} holds the trainable weights only; the rest came from "
            f"load_from={recorded!r}: set load_from to that model directory",
        )
    if recorded and recorded != s.pretrained_from:
        s.logger.warning(
            "resume: %s was trained on %s, and load_from now names %s",
            c.path,
            recorded,
            s.pretrained_from,
        )


def _restore_shards(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    if SHARDED in ckpt and ckpt[SHARDED].get("weights") == TRAINABLE:
        require_base(s, ckpt, c)
    if SHARDED in ckpt:  # model and optimizer, resharded to this run's ranks
        load_shards(s.model, s.optimizer(), ckpt, Path(c.path))


def _restore_rank_slices(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    if RANK_SLICES in ckpt:
        load_local_training_state(s.model, s.optimizer(), ckpt[RANK_SLICES])


def _restore_optimizer(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    if s.optim_wrapper is None or "optimizer" in ckpt.get(SHARDED, {}).get("keys", ()):
        return  # nothing to restore into, or loaded with the shards
    if RANK_SLICES in ckpt:
        return  # loaded with this rank's slices
    if "optimizer" in ckpt and s.pipeline is not None:
        load_stage_optimizer(s.model, s.optim_wrapper.optimizer, ckpt["optimizer"], c.path)
    elif "optimizer" in ckpt and is_sharded(s.model):
        load_full_optimizer_state(s.model, s.optim_wrapper.optimizer, ckpt["optimizer"])
    elif "optimizer" in ckpt:
        s.optim_wrapper.load_state_dict(ckpt["optimizer"])
    else:
        s.logger.warning(
            "%s has no optimizer state (save_optimizer=False): the optimizer starts fresh", c.path
        )


def _restore_scaler(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    if s.optim_wrapper is not None:
        s.optim_wrapper.load_scaler_state_dict(ckpt.get("scaler"))


def _restore_schedulers(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    states = ckpt.get("param_schedulers", [])
    if len(states) != len(s.param_schedulers):
        s.logger.warning(
            "%s has %d scheduler states for %d schedulers: schedulers start fresh",
            c.path,
            len(states),
            len(s.param_schedulers),
        )
        return
    for sched, state in zip(s.param_schedulers, states, strict=True):
        sched.load_state_dict(state)


def _restore_hub(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    s.message_hub.load_state_dict(ckpt.get("message_hub", {}))


def _restore_hooks(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    for name, state in ckpt.get("hooks", {}).items():
        if name in s.hooks and hasattr(s.hooks[name], "load_state_dict"):
            s.hooks[name].load_state_dict(state)


def _restore_sinks(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    # checkpoints from before the sinks were the Runner's kept them in LoggerHook's state
    old = ckpt.get("hooks", {}).get("logger")
    s.sinks.load_state_dict(ckpt.get("sinks") or (old or {}).get("sinks") or [])


def _restore_position(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    if s.train_loop is None:
        return
    position = dict(ckpt["meta"])
    sampler = _ranks(ckpt, "sampler")
    if c.same_world and sampler:
        position["iter_in_epoch"] = sampler[s.rank]["iter_in_epoch"]
    s.train_loop.resume_from(position)


def _collect_train_data(s: CheckpointSubject, o: SaveOptions) -> Any:
    loader = getattr(s.train_loop, "dataloader", None)
    # not state_dict(): torchdata's StatefulDataLoader has one, for one rank, with another meaning
    collect = getattr(loader, "train_data_state", None)
    return collect() if callable(collect) else ABSENT


def _restore_train_data(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    loader = getattr(s.train_loop, "dataloader", None)
    states = _ranks(ckpt, "train_data")
    if states and callable(getattr(loader, "restore_train_data", None)):
        loader.restore_train_data(states)  # type: ignore[union-attr]


def _restore_buffers(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    buffers = _ranks(ckpt, "rank_buffers")
    if c.same_world and buffers:
        mine = buffers[s.rank]
        for name, buf in s.model.named_buffers():
            if name in mine:
                buf.copy_(mine[name])


def _restore_window_grads(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    grads = _ranks(ckpt, "accumulated_grads")
    if not grads or s.optim_wrapper is None:
        return
    if c.same_world:
        dropped = s.optim_wrapper.restore_pending_grads(s.model, grads[s.rank])
        if dropped:
            s.logger.warning(
                "%s was saved inside a gradient-accumulation window with gradients shaped "
                "unlike this run's parameters (%s...; another strategy?): the window's "
                "gradients are dropped",
                c.path,
                dropped[0],
            )
    else:
        s.logger.warning(
            "%s was saved inside a gradient-accumulation window with another "
            "world size or mesh: the window's gradients are dropped",
            c.path,
        )


def _restore_random(s: CheckpointSubject, ckpt: dict, c: LoadContext) -> None:
    states = _ranks(ckpt, "rng")
    if c.same_world and states:
        restore_rng(states[s.rank])
    elif states:
        meta = ckpt["meta"]
        s.logger.warning(
            "%s was saved with %s ranks (mesh %s), this run has %d (mesh %s): random states "
            "are not restored (the run continues, not bit-exactly)",
            c.path,
            meta.get("world_size"),
            saved_mesh(meta),
            s.world_size,
            list(dist.mesh_layout()),
        )


# -- the table ----------------------------------------------------------------------------------
PARTS: tuple[Part, ...] = (
    Part(
        "meta",
        "epoch, iter, iter_in_epoch, samples_in_epoch, val_pending, seed, world_size, mesh, "
        "global_batch, num_streams, batch_size, experiment_name, "
        "time, config (JSON text), versions; the saver's additions: best, async_save, "
        "ema_in_state_dict",
        "always",
        _collect_meta,
    ),
    Part(
        "state_dict",
        "the model's weights (unwrapped)",
        "unless sharded",
        _collect_weights,
        _restore_weights,
    ),
    Part(
        SHARDED,
        "the shards' manifest: their folder, keys and files with sizes",
        "sharded FSDP checkpoints",
        None,
        _restore_shards,
        written_by="the checkpoint writer (checkpoint.sharded.start_shards)",
        publishable=False,
    ),  # names shard folders of the saved file: no stand-alone file
    Part(
        RANK_SLICES,
        "this rank's slices of the sharded weights and of the optimizer's state",
        "only in the state a fault-tolerant replica group sends a healing peer, never in a file",
        None,
        _restore_rank_slices,
        written_by="a replica group's heal (checkpoint.state.collect_rank_state)",
        publishable=False,
    ),
    Part(
        "optimizer",
        "the optimizer's state",
        "with save_optimizer (in the shards if sharded)",
        _collect_optimizer,
        _restore_optimizer,
    ),
    Part(
        "scaler",
        "the AMP GradScaler's state, or None",
        "when training",
        lambda s, o: ABSENT if s.optim_wrapper is None else s.optim_wrapper.scaler_state_dict(),
        _restore_scaler,
    ),
    Part(
        "param_schedulers",
        "one state per scheduler",
        "with save_param_scheduler",
        lambda s, o: (
            [x.state_dict() for x in s.param_schedulers] if o.save_param_scheduler else ABSENT
        ),
        _restore_schedulers,
    ),
    Part(
        "message_hub",
        "runtime info and scalar histories",
        "always",
        lambda s, o: s.message_hub.state_dict(),
        _restore_hub,
    ),
    Part(
        "hooks",
        "each stateful hook's state_dict(), keyed by its registered name",
        "always",
        lambda s, o: {name: hook.state_dict() for name, hook in s.hooks.items()},
        _restore_hooks,
    ),
    Part(
        "sinks",
        "the log sinks' state (the MLflow run id)",
        "always",
        lambda s, o: s.sinks.state_dict(),
        _restore_sinks,
    ),
    Part(
        "sampler",
        "epoch and batches consumed in it; restoring it resumes training at meta's position",
        "always",
        _collect_sampler,
        _restore_position,
        per_rank=True,
    ),
    Part(
        "train_data",
        "where a streamed training set stands: the data and order settings it was built on "
        "and, packed, every stream's cursor; any world size restores it",
        "with StreamingLoader",
        _collect_train_data,
        _restore_train_data,
        per_rank=True,
    ),
    Part(
        "rank_buffers",
        "the model's buffers (BN statistics differ between syncs)",
        "with several ranks",
        _collect_buffers,
        _restore_buffers,
        per_rank=True,
    ),
    Part(
        "accumulated_grads",
        "gradients of an unfinished accumulation window",
        "saved inside one",
        _collect_window_grads,
        _restore_window_grads,
        per_rank=True,
    ),
    Part(
        "rng",
        "python, numpy, torch (and cuda) generator states",
        "always",
        lambda s, o: capture_rng(),
        _restore_random,
        per_rank=True,
    ),
    Part(
        "ema_state_dict",
        "the training weights under 'module.' (state_dict then holds the "
        "average) or, if sharded, the average",
        "with EMAHook",
        written_by="EMAHook.before_save_checkpoint, read by its after_load_checkpoint",
    ),
)

PUBLISHABLE_KEYS: tuple[str, ...] = tuple(p.key for p in PARTS if p.publishable)

# What makes a file a training checkpoint rather than weights only: each entry is met by any one
# of its keys (the weights are in the file, or in its shards). resume_choice reads this.
TRAINING_REQUIRES: tuple[tuple[str, ...], ...] = (("meta",), ("state_dict", SHARDED, RANK_SLICES))


def missing_for_training(ckpt: Any) -> str | None:
    """The first part a training checkpoint needs that ``ckpt`` lacks (by its first key), or
    None when it has them all."""
    if not isinstance(ckpt, dict):
        return TRAINING_REQUIRES[0][0]
    for keys in TRAINING_REQUIRES:
        if not any(key in ckpt for key in keys):
            return keys[0]
    return None


def hook_state(ckpt: dict, name: str) -> dict:
    """The state the hook registered as ``name`` saved in ``ckpt`` (the ``hooks`` part), or {}."""
    return dict((ckpt.get("hooks") or {}).get(name) or {})


def layout_text(indent: int = 4, width: int = 96) -> str:
    """The table as :mod:`distributed_runner.checkpoint.files`'s docstring shows it: key, what it
    holds, [when it is there; who writes it if not the Runner]."""
    lines = []
    for part in PARTS:
        by = f"; written by {part.written_by}" if part.written_by else ""
        text = (
            f"{part.key:<19}{'per rank: ' if part.per_rank else ''}{part.description} "
            f"[{part.present}{by}]"
        )
        lines.append(
            textwrap.fill(
                text,
                width,
                initial_indent=" " * indent,
                subsequent_indent=" " * (indent + 19),
                break_on_hyphens=False,
            )
        )
    return "\n".join(lines)
