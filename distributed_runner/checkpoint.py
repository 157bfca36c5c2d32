"""Checkpoint files: atomic writes, safe loads, RNG capture.

A checkpoint is one dict of tensors and plain containers (so ``torch.load(weights_only=True)`` can
read it without running pickled code)::

    meta              epoch, iter, iter_in_epoch, seed, world_size, config (JSON text), versions
    state_dict        the model's weights (unwrapped)
    optimizer         the optimizer's state (absent when save_optimizer=False)
    param_schedulers  one state per scheduler
    scaler            the AMP GradScaler's state, or None
    message_hub       runtime info and scalar histories
    hooks             each stateful hook's state_dict(), keyed by its registered name
    rng               per rank: python, numpy, torch (and cuda) generator states
    sampler           per rank: epoch and batches consumed in it
    accumulated_grads per rank: gradients of an unfinished accumulation window (only then)
    rank_buffers      per rank: the model's buffers (BN statistics differ between syncs);
                      only with several ranks

Files are written to a temporary name in the same folder and renamed into place, so a crash never
leaves a half-written file under a final name.
"""
from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .errors import ConfigError

LAST_CHECKPOINT_POINTER = "last_checkpoint"


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file beside ``path``, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(text: str, path: str | os.PathLike) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_file(path: str | os.PathLike, key: str, map_location: Any = "cpu") -> dict:
    """Load a checkpoint with ``weights_only=True``; a file that is not one is a one-line error."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(key, f"checkpoint {str(p)!r} does not exist: check the path")
    try:
        ckpt = torch.load(p, map_location=map_location, weights_only=True)
    except Exception as e:  # pickle errors, truncated files, foreign formats
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
        reason = next((ln for ln in lines if "Unpickler error" in ln), lines[0])
        raise ConfigError(key, f"{str(p)!r} is not a loadable checkpoint ({reason[:200]}); pass a "
                               f".pth written by CheckpointHook or torch.save(state_dict)") from None
    if not isinstance(ckpt, dict):
        raise ConfigError(key, f"{str(p)!r} holds a {type(ckpt).__name__}, not a checkpoint dict")
    return ckpt


def read_pointer(folder: str | os.PathLike) -> Path | None:
    """The checkpoint the ``last_checkpoint`` pointer in ``folder`` names, if it still exists."""
    pointer = Path(folder) / LAST_CHECKPOINT_POINTER
    if not pointer.is_file():
        return None
    target = Path(pointer.read_text().strip())
    if not target.is_absolute():
        target = Path(folder) / target
    return target if target.is_file() else None


def capture_rng() -> dict:
    """This process's generator states, as tensors and plain containers."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                  "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    """Inverse of :func:`capture_rng`."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


def model_state_from(ckpt: dict) -> dict:
    """The weights in a full checkpoint, or the dict itself if it already is a state_dict."""
    state = ckpt.get("state_dict", ckpt)
    # weights saved from a DDP-wrapped model carry a 'module.' prefix
    if state and all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state
