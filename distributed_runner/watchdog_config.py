"""``watchdog=dict(...)``: how long a rank may make no progress before the run calls it hung,
how long a collective may wait, and when a slow rank is named a straggler.

The keys, their defaults and why:

* ``hang_timeout`` (300 s): a rank whose loop has not moved (no new phase, no new iteration) for
  this long is hung: its stacks are logged and the run fails over to a restart (Ray) or exits
  non-zero (no Ray). Far below Ray's 600 s worker health check and the 1800 s process-group
  default, far above any healthy iteration.
* ``phase_timeouts``: phases that are slow by nature get their own allowance instead of
  ``hang_timeout``: ``first_iter`` (a compiled model's first step, CUDA/cuDNN warm-up),
  ``val`` (a whole validation), ``checkpoint`` (a save, synchronous or its async hand-off), and
  ``data_warmup`` (the first batch: Ray Data's pipeline start, worker processes forking).
* ``collective_timeout`` (600 s): the process group's timeout, after which a rank blocked in a
  collective raises; longer than ``hang_timeout`` so that the watchdog, which names the hung rank
  and shows its stacks, speaks first.
* ``straggler_ratio`` (2.0) and ``straggler_patience`` (3): a rank whose time before entering the
  step's collective is this many times the ranks' median, for this many logging windows in a
  row, is named a straggler.
* ``enabled`` (True): ``False`` turns the hang watch off (stragglers are still measured).
"""

from __future__ import annotations

from typing import Any

from .errors import ConfigError, check_known_keys, did_you_mean

PHASE_TIMEOUT_DEFAULTS: dict[str, float] = {
    "first_iter": 1800.0,
    "val": 3600.0,
    "checkpoint": 1800.0,
    "data_warmup": 1800.0,
}
WATCHDOG_DEFAULTS: dict[str, Any] = {
    "enabled": True,
    "hang_timeout": 300.0,
    "phase_timeouts": PHASE_TIMEOUT_DEFAULTS,
    "collective_timeout": 600.0,
    "straggler_ratio": 2.0,
    "straggler_patience": 3,
}


def _seconds(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(key, f"takes seconds (> 0), got {value!r}")
    return float(value)


def parse_watchdog(spec: Any) -> dict[str, Any]:
    """The ``watchdog`` config with defaults filled in; ``None``/``True`` mean the defaults,
    ``False`` the defaults with ``enabled=False``. Every mistake is one line naming the key."""
    if spec is None or spec is True:
        spec = {}
    elif spec is False:
        spec = {"enabled": False}
    if not isinstance(spec, dict):
        raise ConfigError(
            "watchdog", f"takes dict(hang_timeout=..., collective_timeout=...), got {spec!r}"
        )
    check_known_keys(spec, WATCHDOG_DEFAULTS, "watchdog")
    out = {**WATCHDOG_DEFAULTS, **spec}
    if not isinstance(out["enabled"], bool):
        raise ConfigError("watchdog.enabled", f"takes True or False, got {out['enabled']!r}")
    out["hang_timeout"] = _seconds("watchdog.hang_timeout", out["hang_timeout"])
    out["collective_timeout"] = _seconds("watchdog.collective_timeout", out["collective_timeout"])
    if out["collective_timeout"] <= out["hang_timeout"]:
        raise ConfigError(
            "watchdog.collective_timeout",
            f"must exceed watchdog.hang_timeout ({out['hang_timeout']:g} s), got "
            f"{out['collective_timeout']:g} s: the watchdog names the hung rank and shows its "
            f"stacks, the collective timeout only ends the wait",
        )
    phases = spec.get("phase_timeouts", {})
    if not isinstance(phases, dict):
        raise ConfigError(
            "watchdog.phase_timeouts", f"takes dict(val=seconds, ...), got {phases!r}"
        )
    for name in phases:
        if name not in PHASE_TIMEOUT_DEFAULTS:
            raise ConfigError(
                f"watchdog.phase_timeouts.{name}",
                f"unknown phase{did_you_mean(name, PHASE_TIMEOUT_DEFAULTS)};"
                f" phases: {', '.join(PHASE_TIMEOUT_DEFAULTS)}",
            )
    out["phase_timeouts"] = {
        name: _seconds(f"watchdog.phase_timeouts.{name}", phases.get(name, default))
        for name, default in PHASE_TIMEOUT_DEFAULTS.items()
    }
    ratio = out["straggler_ratio"]
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 1:
        raise ConfigError("watchdog.straggler_ratio", f"takes a number > 1, got {ratio!r}")
    out["straggler_ratio"] = float(ratio)
    patience = out["straggler_patience"]
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
        raise ConfigError(
            "watchdog.straggler_patience", f"takes a whole number >= 1, got {patience!r}"
        )
    return out
