"""Seeding: ``randomness=dict(seed=None, deterministic=False, diff_rank_seed=False)``.

With no seed one is drawn on rank 0 and shared, so every rank (and the checkpoint's meta) knows the
run's seed. ``diff_rank_seed`` offsets it by the rank (different dropout masks / augmentations per
rank); samplers always use the shared seed so the ranks' shards stay disjoint.

A checkpoint keeps every generator's state (:func:`capture_rng`, per rank) so a resumed run
draws the same numbers the uninterrupted one would (:func:`restore_rng`).
"""

from __future__ import annotations

import logging
import os
import random
import secrets

import numpy as np
import torch

from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError

_KNOWN = ("seed", "deterministic", "diff_rank_seed")


def set_random_seed(randomness: dict | None) -> int:
    """Seed python, numpy and torch; returns the shared (pre-offset) seed.

    Args:
        seed (int | None): the run's seed; None draws one from the OS on rank 0 and shares it.
        deterministic (bool): ask torch for deterministic algorithms (slower on GPUs).
        diff_rank_seed (bool): add the rank to the seed, so ranks draw different numbers.
    """
    cfg = dict(randomness or {})
    for key in cfg:
        if key not in _KNOWN:
            raise ConfigError(
                f"randomness.{key}", f"unknown option; randomness takes {', '.join(_KNOWN)}"
            )
    seed = cfg.get("seed")
    if seed is None:
        seed = dist.broadcast_object(secrets.randbits(31))  # the OS entropy
    seed = int(seed)
    # by data-parallel rank: a tensor-parallel group's ranks must draw alike (same dropout)
    rank_seed = seed + dist.get_data_parallel_rank() if cfg.get("diff_rank_seed") else seed
    random.seed(rank_seed)
    np.random.seed(rank_seed % 2**32)
    torch.manual_seed(rank_seed)
    if cfg.get("deterministic"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return seed


def with_resumed_seed(
    randomness: dict | None, resumed: int | None, logger: logging.Logger
) -> dict | None:
    """``randomness`` with the seed of the checkpoint being resumed, when there is one: the
    epochs' order follows the seed, so a resumed run must keep its own (a config without a
    seed would draw another; one with a different seed is told which wins)."""
    if resumed is None:
        return randomness
    cfg = dict(randomness or {})
    if cfg.get("seed") is not None and int(cfg["seed"]) != resumed:
        logger.warning(
            "randomness.seed is %s but the checkpoint being resumed was seeded %s: "
            "resuming with %s, so its epochs keep their order",
            cfg["seed"],
            resumed,
            resumed,
        )
    cfg["seed"] = resumed
    return cfg


def capture_rng() -> dict:
    """This process's generator states, as tensors and plain containers."""
    np_state = np.random.get_state(legacy=True)
    # the global generator is MT19937, whose legacy state is a tuple (a dict is for others)
    assert isinstance(np_state, tuple)
    state = {
        "python": random.getstate(),
        "numpy": {
            "name": np_state[0],
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
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
    np.random.set_state(
        (
            n["name"],
            n["keys"].numpy().astype(np.uint32),
            n["pos"],
            n["has_gauss"],
            n["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
