"""``env_cfg``: the process settings a run applies before anything is built.

``env_cfg=dict(num_threads=N)`` sets torch's intra-op threads (``torch.set_num_threads``). The
thread count changes how float sums are grouped, so two runs of one config and seed give the
same losses only with the same count: a ``drun tune`` trial runs with the CPUs Ray gives it (Ray
sets ``OMP_NUM_THREADS`` to them, 1 by default) while ``drun train`` on the same machine takes
every core; the sweep writes the trials' count here so that ``best_config.py`` repeats its
trial exactly. MMEngine's keys (``cudnn_benchmark``, ``mp_cfg``, ``dist_cfg``) are accepted and
have no effect here (the launcher and strategy own those choices); any other key is an error,
so a misspelling never passes silently.
"""

from __future__ import annotations

from typing import Any

import torch

from distributed_runner.core.errors import ConfigError

APPLIED = ("num_threads",)
MMENGINE_ONLY = ("cudnn_benchmark", "mp_cfg", "dist_cfg")


def check_env_cfg(env_cfg: Any) -> dict:
    """``env_cfg`` as a dict, or a one-line ConfigError naming the key at fault."""
    if env_cfg is None:
        return {}
    if not isinstance(env_cfg, dict):
        raise ConfigError(
            "env_cfg", f"expected a dict such as dict(num_threads=4), got {env_cfg!r}"
        )
    for key in env_cfg:
        if key not in APPLIED + MMENGINE_ONLY:
            raise ConfigError(
                f"env_cfg.{key}",
                f"unknown key: env_cfg takes {', '.join(APPLIED)} (and MMEngine's "
                f"{', '.join(MMENGINE_ONLY)}, which have no effect here)",
            )
    threads = env_cfg.get("num_threads")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ConfigError("env_cfg.num_threads", f"{threads!r} is not a whole number >= 1")
    return dict(env_cfg)


def apply_env_cfg(env_cfg: Any) -> int:
    """Apply ``env_cfg`` to this process; returns torch's thread count from now on."""
    threads = check_env_cfg(env_cfg).get("num_threads")
    if threads is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()
