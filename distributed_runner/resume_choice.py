"""Which checkpoint ``resume=True`` (``drun train --resume``) continues from.

The rule, so that resuming never loses work and never trusts a damaged file:

1. the checkpoint ``work_dir/last_checkpoint`` names, if it loads and verifies;
2. else the newest training checkpoint in ``work_dir`` that does (newest by the iteration in its
   meta, then by modification time) — a dangling, empty or binary pointer, or a pointer to a
   truncated or bit-rotten file, falls back here, and the log says what was skipped and why;
3. if checkpoints exist but none verifies: a one-line error. A run that has checkpoints is never
   silently started over (before, a broken pointer restarted from iteration 0 and overwrote them);
4. no checkpoint at all: start fresh (the first run of ``--resume`` scripts).

An explicit ``resume=PATH`` is not second-guessed: that file, verified, or a one-line error.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterable

import torch

from .checkpoint import LAST_CHECKPOINT_POINTER, CheckpointDamaged, load_file, read_pointer
from .errors import ConfigError
from .sharded_checkpoint import SHARDED


def _is_training_checkpoint(ckpt: Any) -> bool:
    return isinstance(ckpt, dict) and "meta" in ckpt and ("state_dict" in ckpt
                                                           or SHARDED in ckpt)


def ranked_checkpoints(paths: Iterable[Path]) -> list[tuple[int, Path]]:
    """(iteration, path) of the ``paths`` that may hold a training state, newest first (by the
    iteration in their meta, then by modification time). Reading the meta maps the file, no
    tensor is read. Files that do not even open rank last, at iteration -1, so they are tried —
    and reported — after every readable one. Weights-only files are left out."""
    ranked = []
    for path in paths:
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - unreadable: a candidate that will be reported
            ranked.append((-1, path.stat().st_mtime, path))
            continue
        if _is_training_checkpoint(ckpt):
            ranked.append((int(ckpt["meta"].get("iter", -1)), path.stat().st_mtime, path))
    ranked.sort(key=lambda r: (r[0], r[1]), reverse=True)
    return [(iteration, path) for iteration, _, path in ranked]


def checkpoint_files(folder: Path) -> list[Path]:
    """The ``*.pth`` files in ``folder`` that may hold a training state, newest first
    (:func:`ranked_checkpoints`)."""
    return [path for _, path in ranked_checkpoints(folder.glob("*.pth"))]


def _pointer_note(folder: Path, target: Path | None) -> str | None:
    pointer = folder / LAST_CHECKPOINT_POINTER
    if not pointer.exists():
        return None
    if target is None:
        return f"{LAST_CHECKPOINT_POINTER} names no checkpoint file (dangling, empty, binary " \
               f"or a folder)"
    return None


def choose_checkpoint(folder: str | Path, logger: logging.Logger,
                      key: str = "resume") -> tuple[Path, dict] | tuple[None, None]:
    """(path, loaded checkpoint) to resume from, or (None, None) when ``folder`` has none; see
    the module docstring. Raises a one-line ConfigError when checkpoints exist but none
    verifies."""
    folder = Path(folder)
    target = read_pointer(folder)
    skipped: list[str] = []
    note = _pointer_note(folder, target)
    if note:
        skipped.append(note)
    order = ([target] if target else []) + [p for p in checkpoint_files(folder) if p != target]
    for path in order:
        try:
            ckpt = load_file(path, key)
        except CheckpointDamaged as e:
            skipped.append(f"{path.name}: {str(e).split(': ', 1)[-1]}")
            continue
        if not _is_training_checkpoint(ckpt):
            skipped.append(f"{path.name}: weights only, no training state")
            continue
        if skipped:
            logger.warning("resume: %s; resuming from %s (iter %s), the newest checkpoint in %s "
                           "that verifies", "; ".join(skipped), path.name,
                           ckpt["meta"].get("iter"), folder)
        return path, ckpt
    if order:
        raise ConfigError(key, f"{folder} has checkpoints but none verifies ({'; '.join(skipped)})"
                               f": pass --resume PATH of a good one, or move them away to start "
                               f"over")
    if note:
        logger.warning("resume: %s and %s holds no checkpoint: starting fresh", note, folder)
    return None, None
