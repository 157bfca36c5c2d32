"""The training state a checkpoint holds, collected and restored as :data:`~.parts.PARTS`
declares it.

Per-rank parts are gathered from every rank, so both functions run on every rank; only rank 0
writes the result. They act on a :class:`~.types.CheckpointSubject` (what the Runner
hands over), not on the Runner: which checkpoint to load is :mod:`.resume_choice`'s decision,
taken before any of this runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distributed_runner.checkpoint.files import load_weights, model_state_from
from distributed_runner.checkpoint.parts import PARTS, RANK_SLICES, saved_mesh
from distributed_runner.checkpoint.sharded import SHARDED, TRAINABLE, load_shards
from distributed_runner.checkpoint.types import ABSENT, CheckpointSubject, LoadContext, SaveOptions
from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError
from distributed_runner.model.sharding import local_training_state
from distributed_runner.parallel.pipeline import load_stage_weights


def collect_training_state(subject: CheckpointSubject, options: SaveOptions) -> dict:
    """The checkpoint dict for ``subject``'s current position (collective: call on every rank,
    which all take the same parts in the same order). Parts written by others (the shards'
    manifest, a hook's) are added later by them."""
    ckpt: dict = {}
    for part in PARTS:
        if part.collect is None:
            continue
        value = part.collect(subject, options)
        if value is ABSENT:
            continue
        ckpt[part.key] = {"ranks": dist.all_gather_object(value)} if part.per_rank else value
    return ckpt


def collect_rank_state(subject: CheckpointSubject, params: list[tuple[str, Any]]) -> dict:
    """This rank's training state without a collective, for the same rank of another group
    with the same mesh: its slices of the sharded weights (``params``, the sharded parameters
    by name) and optimizer, and its own entry of each per-rank part. A fault-tolerant replica
    group sends it to a healing peer while it trains (a collective then would cross the step's
    own); :func:`restore_training_state` takes it as it takes a checkpoint."""
    ckpt: dict = {}
    for part in PARTS:
        if part.collect is None:
            continue
        value = part.collect(subject, SaveOptions(with_weights=False))
        if value is ABSENT:
            continue
        if part.per_rank:
            ranks: list = [None] * subject.world_size
            ranks[subject.rank] = value
            value = {"ranks": ranks}
        ckpt[part.key] = value
    ckpt[RANK_SLICES] = local_training_state(params, subject.optimizer())
    return ckpt


def restore_training_state(subject: CheckpointSubject, ckpt: dict, path: str | Path) -> None:
    """Give ``subject`` back the state in ``ckpt``, part by part in the table's order; each rank
    takes its own per-rank parts when the world size and its mesh (dp_replicate, dp_shard, tp)
    are the ones the checkpoint was saved with (the same ranks holding the same slices)."""
    meta = ckpt["meta"]
    same_world = int(meta.get("world_size", 1)) == subject.world_size and saved_mesh(meta) == list(
        dist.mesh_layout()
    )
    context = LoadContext(path, same_world)
    for part in PARTS:
        if part.restore is not None:
            part.restore(subject, ckpt, context)


def load_model_weights(
    subject: CheckpointSubject, ckpt: dict, path: str | Path, key: str, strict: bool = True
) -> None:
    """Only the checkpoint's weights into ``subject.model`` (``load_from``): from its shards or
    its ``state_dict``."""
    if ckpt.get("meta", {}).get("weights") == TRAINABLE:
        raise ConfigError(
            key,
            f"{path} holds the trainable weights only (save_frozen_weights=False): resume "
            f"it, or export it (drun export) and load_from the directory written",
        )
    if SHARDED in ckpt:
        load_shards(subject.model, None, ckpt, Path(path))
    elif subject.pipeline is not None:  # this rank's stages of the whole model's weights
        load_stage_weights(subject.model, model_state_from(ckpt), path, key)
    else:
        load_weights(subject.model, model_state_from(ckpt), key, path, strict=strict)
