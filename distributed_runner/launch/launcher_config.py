"""The Ray launcher's options and the driver's config check, apart from the launcher that acts on
them (:mod:`distributed_runner.launch.launcher`).

:func:`normalize_launcher` fills in ``launcher=dict(type='ray', ...)`` and refuses an unknown or
ill-typed option in one line; :func:`validate_config` checks on the driver, before any worker
starts, that the config will build: every section's driver step, the model built on the meta
device (no memory) and no data read but the footers of streamed files. Both are used by
everything that starts workers (``drun train --launcher ray``, ``drun check``, ``drun tune``'s
trials and the docs' config checks). The launcher's own section is declared here
(:data:`LAUNCHER_SECTION`), beside its parser.
"""

from __future__ import annotations

from typing import Any

from distributed_runner.core.config import runs_in_process, to_plain
from distributed_runner.core.errors import ConfigError, did_you_mean
from distributed_runner.engine.config_prep import prepare_config
from distributed_runner.engine.sections import (
    DriverPlan,
    Section,
    register_section,
    run_driver_steps,
    settings_of,
)

RAY_DEFAULTS: dict[str, Any] = {
    "type": "ray",
    "num_workers": 1,
    "use_gpu": False,
    "resources_per_worker": None,
    "placement_strategy": "PACK",
    "address": None,
    "storage_path": None,
    "name": None,
    "max_failures": 0,
    "elastic_resize_monitor_interval_s": 60.0,
    "verbose": False,
}
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def normalize_launcher(spec: Any) -> dict | None:
    """The launcher config with defaults filled in, or None for the single-process path.

    Args:
        type (str): 'none' (one process) or 'ray' (Ray Train workers).
        num_workers (int | tuple): training workers, or (min, max) for an elastic group.
        use_gpu (bool): one GPU per worker.
        resources_per_worker (dict | None): Ray resources of one worker, e.g. ``{'CPU': 2}``.
        placement_strategy (str): how workers spread over nodes: PACK, SPREAD, STRICT_PACK or
            STRICT_SPREAD.
        address (str | None): the Ray cluster to join ('auto', 'ray://host:10001'); None
            starts a local one.
        storage_path (str | None): where Ray keeps the run's reported checkpoints (shared
            storage or s3:// on several nodes); default ``work_dir/ray_storage``.
        name (str | None): the Ray run's name; rerunning with the same name resumes it.
        max_failures (int): worker-group restarts allowed after a failure (-1: no limit).
        elastic_resize_monitor_interval_s (float): seconds between an elastic group's checks
            for room to grow.
        verbose (bool): show Ray Train's own per-report lines (checkpoint persisted, result
            reported), which drun hides by default.
    """
    if runs_in_process(spec):
        return None
    if spec == "ray":
        spec = {"type": "ray"}
    if not isinstance(spec, dict):
        raise ConfigError(
            "launcher", f"expected 'none', 'ray' or dict(type='ray', ...), got {spec!r}"
        )
    if spec.get("type", "ray") != "ray":
        raise ConfigError(
            "launcher.type", f"unknown launcher {spec['type']!r}: use 'none' or 'ray'"
        )
    options = ", ".join(k for k in RAY_DEFAULTS if k != "type")
    for key in spec:
        if key not in RAY_DEFAULTS:
            raise ConfigError(
                f"launcher.{key}",
                f"unknown option{did_you_mean(key, RAY_DEFAULTS)};"
                f" the ray launcher takes {options}",
            )
    out = {**RAY_DEFAULTS, **spec}
    out["num_workers"] = _worker_count(out["num_workers"])
    _check_ray_options(out)
    return out


def _check_ray_options(out: dict) -> None:
    """The launcher's options other than ``num_workers``, each one line when wrong."""
    if (
        not isinstance(out["elastic_resize_monitor_interval_s"], (int, float))
        or out["elastic_resize_monitor_interval_s"] < 0
    ):
        raise ConfigError("launcher.elastic_resize_monitor_interval_s", "must be seconds >= 0")
    if not isinstance(out["max_failures"], int) or out["max_failures"] < -1:
        raise ConfigError("launcher.max_failures", "must be an int >= 0 (or -1: no limit)")
    if not isinstance(out["verbose"], bool):
        raise ConfigError("launcher.verbose", f"takes True or False, got {out['verbose']!r}")
    if out["placement_strategy"] not in PLACEMENT_STRATEGIES:
        raise ConfigError(
            "launcher.placement_strategy", f"must be one of {', '.join(PLACEMENT_STRATEGIES)}"
        )
    res = out["resources_per_worker"]
    if res is not None and (
        not isinstance(res, dict) or not all(isinstance(v, (int, float)) for v in res.values())
    ):
        raise ConfigError("launcher.resources_per_worker", "must be a dict like {'CPU': 2}")


def worker_resources(opts: dict) -> dict[str, float]:
    """What one Ray Train worker asks for under the normalized launcher ``opts``: its
    ``resources_per_worker`` with 1 CPU (and 1 GPU with ``use_gpu``) unless it names them."""
    res = dict(opts["resources_per_worker"] or {})
    res.setdefault("CPU", 1)
    if opts["use_gpu"]:
        res.setdefault("GPU", 1)
    return res


def uses_ray_data(cfg: dict) -> bool:
    """Whether the training data comes through Ray Data (which needs CPUs of its own)."""
    loader = cfg.get("train_dataloader")
    return isinstance(loader, dict) and loader.get("type") == "RayDataLoader"


def _worker_count(value: Any) -> int | tuple[int, int]:
    """``num_workers``: an int >= 1, or ``(min, max)`` (a list after a round trip through
    plain config) for an elastic group."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 1 <= value[0] <= value[1]
    ):
        return (value[0], value[1]) if value[0] < value[1] else value[0]
    raise ConfigError(
        "launcher.num_workers",
        f"must be an int >= 1 or (min, max) with 1 <= min <= max, got {value!r}",
    )


def validate_config(cfg: dict, check_device: bool = False) -> DriverPlan:
    """Check on the Ray driver, before any worker starts, that the config will build; returns
    what the driver steps found, with the plain config the workers get.

    The config is prepared as each worker's ``Runner.from_cfg`` prepares it
    (:func:`~distributed_runner.engine.config_prep.prepare_config`: every section parsed once),
    on a copy, so the caller's own stays as given; the device is the workers' to check. Then
    every section's driver step (:mod:`distributed_runner.engine.config_sections`): paths made
    absolute in that copy, the mesh against the workers, the model built on the meta device and
    checked against its plan and its files, data, metrics, optimizers and schedulers resolved,
    the hooks planned. The plan's ``notes`` are the iMIX translations, for the workers to log.
    """
    prepared, notes = prepare_config(to_plain(cfg), check_device=check_device)
    settings = settings_of(prepared)
    assert settings is not None, "prepare_config attaches the settings"
    plain = to_plain(prepared)
    plan = run_driver_steps(plain, settings)
    plan.notes = notes
    return plan


LAUNCHER_SECTION = register_section(
    Section(
        "launcher",
        "'none' (this process) or dict(type='ray', num_workers=..., ...): launch/",
        normalize_launcher,
    )
)
