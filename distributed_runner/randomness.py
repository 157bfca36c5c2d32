"""Seeding: ``randomness=dict(seed=None, deterministic=False, diff_rank_seed=False)``.

With no seed one is drawn on rank 0 and shared, so every rank (and the checkpoint's meta) knows the
run's seed. ``diff_rank_seed`` offsets it by the rank (different dropout masks / augmentations per
rank); samplers always use the shared seed so the ranks' shards stay disjoint.
"""
from __future__ import annotations

import os
import random
import secrets

import numpy as np
import torch

from . import dist
from .errors import ConfigError

_KNOWN = ("seed", "deterministic", "diff_rank_seed")


def set_random_seed(randomness: dict | None) -> int:
    """Seed python, numpy and torch; returns the shared (pre-offset) seed."""
    cfg = dict(randomness or {})
    for key in cfg:
        if key not in _KNOWN:
            raise ConfigError(f"randomness.{key}", f"unknown option; randomness takes "
                                                   f"{', '.join(_KNOWN)}")
    seed = cfg.get("seed")
    if seed is None:
        seed = dist.broadcast_object(secrets.randbits(31))  # the OS entropy
    seed = int(seed)
    rank_seed = seed + dist.get_rank() if cfg.get("diff_rank_seed") else seed
    random.seed(rank_seed)
    np.random.seed(rank_seed % 2**32)
    torch.manual_seed(rank_seed)
    if cfg.get("deterministic"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return seed
