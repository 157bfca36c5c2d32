"""``val_cfg``'s own keys for where validation runs: ``mode``, ``lag`` and ``resources``.

``val_cfg=dict(mode='inline')`` (the default) validates inside the training loop, as MMEngine
does. ``mode='async'`` validates each due checkpoint on separate resources while training goes on
(:mod:`distributed_runner.async_val`); its results are applied ``lag`` due validations later on
every rank (default 1), so decisions taken on them (early stopping, the best checkpoint) land at
fixed iterations and a resumed run takes them exactly as an uninterrupted one. ``resources`` is
what one validation takes on Ray (``{'CPU': 1, 'GPU': 0}`` by default; the launcher refuses a
cluster that would leave it nothing). The other keys of ``val_cfg`` are the validation loop's
arguments; these three are taken out before the loop is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError, did_you_mean

MODES = ("inline", "async")
KEYS = ("mode", "lag", "resources")
RESOURCE_NAMES = ("CPU", "GPU")


@dataclass(frozen=True)
class ValMode:
    """Where validation runs; see the module docstring."""

    mode: str = "inline"
    lag: int = 1
    resources: dict[str, float] = field(default_factory=lambda: {"CPU": 1.0, "GPU": 0.0})

    @property
    def is_async(self) -> bool:
        return self.mode == "async"


def parse_val_mode(val_cfg: Any) -> ValMode:
    """The :class:`ValMode` ``val_cfg`` asks for; one ConfigError line for a mistake."""
    if not isinstance(val_cfg, dict):
        return ValMode()
    mode = val_cfg.get("mode", "inline")
    if mode not in MODES:
        raise ConfigError(
            "val_cfg.mode",
            f"got {mode!r}; takes 'inline' or 'async'"
            + (did_you_mean(mode, MODES) if isinstance(mode, str) else ""),
        )
    lag = val_cfg.get("lag", 1)
    if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
        raise ConfigError("val_cfg.lag", f"got {lag!r}; takes an int >= 0 (due validations)")
    resources = val_cfg.get("resources", {"CPU": 1, "GPU": 0})
    if not isinstance(resources, dict):
        raise ConfigError("val_cfg.resources", f"got {resources!r}; takes a dict like {{'CPU': 1}}")
    for name, amount in resources.items():
        if name not in RESOURCE_NAMES:
            raise ConfigError(
                "val_cfg.resources",
                f"unknown resource {name!r}; takes 'CPU' and 'GPU'"
                + did_you_mean(str(name), RESOURCE_NAMES),
            )
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise ConfigError("val_cfg.resources", f"{name}: got {amount!r}; takes a number >= 0")
    if mode == "async" and not any(resources.values()):
        raise ConfigError("val_cfg.resources", "an async validation needs some CPU or GPU")
    full = {"CPU": 0.0, "GPU": 0.0, **{k: float(v) for k, v in resources.items()}}
    if "CPU" not in resources:
        full["CPU"] = 1.0
    return ValMode(mode=mode, lag=lag, resources=full)


def split_val_cfg(val_cfg: dict | None) -> tuple[dict | None, ValMode]:
    """``val_cfg`` without this module's keys (the loop's arguments), and the :class:`ValMode`."""
    if val_cfg is None:
        return None, ValMode()
    mode = parse_val_mode(val_cfg)
    return {k: v for k, v in val_cfg.items() if k not in KEYS}, mode


def check_val_resources(
    val_cfg: Any, per_worker: dict[str, float], workers: int, total: dict[str, float]
) -> None:
    """One line when the cluster would leave an async validation nothing to run on: Ray would
    not refuse it, the validation would just wait silently until training ends."""
    mode = parse_val_mode(val_cfg)
    if not mode.is_async:
        return
    for resource, need in mode.resources.items():
        have = float(total.get(resource, 0))
        spare = have - float(per_worker.get(resource, 0)) * workers
        if need > 0 and spare < need:
            raise ConfigError(
                "val_cfg.resources",
                f"asynchronous validation needs {need:g} {resource} beside the {workers} "
                f"training workers, and the cluster has {have:g} {resource}, {max(spare, 0):g} "
                f"left: lower launcher.num_workers, lower val_cfg.resources or add nodes",
            )
