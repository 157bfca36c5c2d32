"""Sharded checkpoints: with ``strategy=dict(type='fsdp', checkpoint='sharded')`` (the FSDP
default) every rank writes its own shards of the model and optimizer through
``torch.distributed.checkpoint`` (DCP) instead of gathering them to rank 0.

One checkpoint is still one name for everything that handles checkpoints (CheckpointHook's
interval, max_keep_ckpts and save_best, ``last_checkpoint``, resume, Ray)::

    iter_8.pth                 the manifest: every part but the weights and optimizer state
    iter_8.pth.crc32           (checkpoint.parts.PARTS), and ``sharded`` = {dir, keys, files}
    iter_8.<token>.dcp/        DCP's files: .metadata and each rank's __<rank>_<n>.distcp

Why the manifest is written last, by rank 0, after DCP has finished on every rank: its existence
is the commit. A crash while shards are written leaves a folder no manifest names, which resume
never picks and the next run removes. The folder name carries a token so that re-saving a name
(``last.pth``) never overwrites the shards the current manifest names. Loading checks that every
file the manifest lists is there with its size (a torn copy is refused like a damaged file), and
DCP reshards: a checkpoint written by 2 ranks resumes on another number (tested: 2 -> 1).
"""

from __future__ import annotations

import shutil
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.core import dist
from distributed_runner.model.sharding import is_sharded

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

SHARDED = "sharded"
# a checkpoint whose weights are the trainable parameters only (CheckpointHook's
# save_frozen_weights=False): the frozen rest comes back from load_from's model directory
TRAINABLE = "trainable"


def _options(trainable: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=trainable, strict=not trainable)


def writes_shards(strategy: Any, model: nn.Module) -> bool:
    """Whether checkpoints are sharded: an FSDP ``model`` with ``strategy`` checkpoint='sharded'."""
    return strategy.get("checkpoint") == "sharded" and is_sharded(model)


def shard_folders(path: Path) -> list[Path]:
    """The shard folders next to checkpoint ``path`` (none for a one-file checkpoint)."""
    return sorted(Path(path).parent.glob(f"{Path(path).stem}.*.dcp"))


def start_shards(
    model: nn.Module,
    optimizer: Optimizer | None,
    rank: int,
    path: Path,
    asynchronous: bool = False,
    group: Any = None,
    stager: Any = None,
    trainable: bool = False,
) -> tuple[dict, Any]:
    """Every rank writes its shards of the model (and of ``optimizer``, unless None) next to
    ``path``, now or (with
    ``asynchronous``) in DCP's background thread after copying them to host memory. Returns the
    manifest's ``sharded`` entry (its file list is filled by :func:`finish_shards`) and DCP's
    future (None when written already). ``trainable``: the frozen parameters are left out
    (:data:`TRAINABLE`)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    token = dist.broadcast_object(f"{time.time_ns():x}" if rank == 0 else None)
    folder = path.parent / f"{path.stem}.{token}.dcp"
    state: dict[str, Any] = {"model": get_model_state_dict(model, options=_options(trainable))}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    entry = {"dir": folder.name, "keys": list(state), "files": {}}
    if trainable:
        entry["weights"] = TRAINABLE
    if asynchronous:  # the same shards every time: the global plan is kept, not re-agreed
        planner = DefaultSavePlanner(enable_plan_caching=True)
        return entry, dcp.async_save(
            state,
            checkpoint_id=str(folder),
            process_group=group,
            async_stager=stager,
            planner=planner,
        )
    dcp.save(state, checkpoint_id=str(folder))
    return entry, None


def finish_shards(rank: int, path: Path, entry: dict) -> None:
    """Once written: every rank's files with their sizes into ``entry`` (each rank lists its own:
    on several machines each sees only those). A collective."""
    folder = Path(path).parent / entry["dir"]
    mine = {
        f.name: f.stat().st_size for f in sorted(folder.iterdir()) if is_ranks_file(f.name, rank)
    }
    entry["files"] = {k: v for part in dist.all_gather_object(mine) for k, v in part.items()}


def is_ranks_file(name: str, rank: int) -> bool:
    """Whether DCP's file ``name`` was written by ``rank`` (``__<rank>_<n>.distcp``; the
    ``.metadata`` is rank 0's, which coordinates the save)."""
    return name.startswith(f"__{rank}_") or (rank == 0 and not name.startswith("__"))


def after_manifest_written(path: Path, ckpt: dict) -> None:
    """Rank 0, once ``path`` (the manifest) is in place: remove older shard folders of the same
    name, which no manifest names any more."""
    current = ckpt.get(SHARDED, {}).get("dir")
    for folder in shard_folders(path):
        if folder.name != current:
            shutil.rmtree(folder, ignore_errors=True)


def remove_shards(path: Path) -> None:
    for folder in shard_folders(Path(path)):
        shutil.rmtree(folder, ignore_errors=True)


def manifest_of(shards: Path) -> Path:
    """The manifest a shard folder ``<stem>.<token>.dcp`` belongs to: ``<stem>.pth`` beside it
    (:func:`start_shards` names the folder so), whether or not it exists."""
    shards = Path(shards)
    return shards.with_name(shards.name.rsplit(".", 2)[0] + ".pth")


def remove_orphan_shards(folder: Path) -> int:
    """Shard folders no manifest names (a save a crash interrupted); returns how many went."""
    removed = 0
    for shards in Path(folder).glob("*.dcp"):
        manifest = manifest_of(shards)
        if not manifest.is_file():
            shutil.rmtree(shards, ignore_errors=True)
            removed += 1
    return removed


def missing_shards(path: Path, ckpt: dict) -> str | None:
    """Why the shards ``ckpt`` names are not all there at the sizes written, or None."""
    entry = ckpt[SHARDED]
    folder = Path(path).parent / entry["dir"]
    for name, size in entry.get("files", {}).items():
        f = folder / name
        if not f.is_file():
            return f"its shard file {entry['dir']}/{name} is missing"
        if f.stat().st_size != size:
            return (
                f"its shard file {entry['dir']}/{name} has {f.stat().st_size} bytes, "
                f"{size} when it was written"
            )
    return None


def load_shards(model: nn.Module, optimizer: Optimizer | None, ckpt: dict, path: Path) -> None:
    """Read the shards into ``model`` (and ``optimizer`` unless None, if they hold its state),
    resharded to this run's ranks; every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    entry = ckpt[SHARDED]
    trainable = entry.get("weights") == TRAINABLE
    state: dict[str, Any] = {"model": get_model_state_dict(model, options=_options(trainable))}
    loaded_optimizer = optimizer if "optimizer" in entry["keys"] else None
    if loaded_optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, loaded_optimizer)
    with warnings.catch_warnings():  # one process: DCP says it assumes so
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(Path(path).parent / entry["dir"]))
    set_model_state_dict(model, state["model"], options=_options(trainable))
    if loaded_optimizer is not None:
        set_optimizer_state_dict(model, loaded_optimizer, state["optimizer"])


def full_weights(path: Path, ckpt: dict) -> dict:
    """The whole model's weights from a sharded checkpoint, read by one process (publishing a
    deployable file needs no process group)."""
    import tempfile

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "full.pt"
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp_to_torch_save(str(Path(path).parent / ckpt[SHARDED]["dir"]), str(out))
        return torch.load(out, map_location="cpu", weights_only=True)["model"]
