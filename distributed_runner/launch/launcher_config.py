"""The Ray launcher's options and the driver's config check, apart from the launcher that acts on
them (:mod:`distributed_runner.launch.launcher`).

:func:`normalize_launcher` fills in ``launcher=dict(type='ray', ...)`` and refuses an unknown or
ill-typed option in one line; :func:`validate_config` checks on the driver, before any worker
starts, that the config will build, without building the model or the data. Both are used by
everything that starts workers (``drun train --launcher ray`` and the docs' config checks).
"""

from __future__ import annotations

from typing import Any

from distributed_runner.core import registry
from distributed_runner.core.config import runs_in_process
from distributed_runner.core.errors import ConfigError, did_you_mean
from distributed_runner.core.signatures import check_arguments
from distributed_runner.data.elastic import check_elastic_config
from distributed_runner.data.ray_data import NOT_WITH_TP
from distributed_runner.engine.config_prep import prepare_config
from distributed_runner.model.sharding import parse_strategy
from distributed_runner.parallel.mesh import MeshShape

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


def validate_config(cfg: dict) -> None:
    """Check on the Ray driver, before any worker starts, that the config will build — without
    building the model or the data.

    The config is prepared as each worker's ``Runner.from_cfg`` prepares it
    (:func:`~distributed_runner.engine.config_prep.prepare_config`), on a copy: the workers get it
    as given and log the iMIX notes themselves; the device is theirs to check. Then what is the
    driver's own: the hooks planned (built and checked; their sinks checked, not built), the sizes
    of an elastic group, and models, datasets, metrics, optimizers and schedulers resolved, their
    arguments matched against the constructors' signatures.
    """
    from distributed_runner.engine.hook_builder import plan_hooks

    cfg, _ = prepare_config(dict(cfg), check_device=False)
    plan_hooks(cfg)
    _check_mesh(cfg)  # tp and dp_replicate divide the workers
    check_elastic_config(cfg)  # every size of an elastic group splits the global batch evenly
    _check_spec(registry.MODELS, cfg["model"], "model")
    for stage in ("train", "val", "test"):
        loader = cfg.get(f"{stage}_dataloader")
        if isinstance(loader, dict) and loader.get("type") != "RayDataLoader":
            _check_spec(registry.DATASETS, loader.get("dataset"), f"{stage}_dataloader.dataset")
        if isinstance(loader, dict) and loader.get("type") == "StreamingLoader":
            from distributed_runner.data.streaming import StreamingLoader

            args = {k: v for k, v in loader.items() if k != "type"}
            check_arguments(StreamingLoader, args, f"{stage}_dataloader")
        evaluator = cfg.get(f"{stage}_evaluator")
        if isinstance(evaluator, list):
            for i, metric in enumerate(evaluator):
                _check_spec(registry.METRICS, metric, f"{stage}_evaluator[{i}]")
        else:
            _check_spec(registry.METRICS, evaluator, f"{stage}_evaluator")
    _check_optim_parts(cfg)


def _check_mesh(cfg: dict) -> None:
    """A tensor-parallel or HSDP strategy fits the worker count (model/sharding.py's mesh), one
    line on the driver rather than on every worker. An elastic group is refused with them: Ray
    may start it at a size that ``tp`` does not divide."""
    strategy = parse_strategy(cfg.get("strategy"))
    if strategy["type"] != "fsdp" or (strategy["tp"] == 1 and strategy["dp_replicate"] == 1):
        return
    launcher = normalize_launcher(cfg.get("launcher"))  # 'ray', 'none', a dict or None
    if launcher is None:
        return
    workers = launcher["num_workers"]
    if isinstance(workers, tuple):
        raise ConfigError(
            "launcher.num_workers",
            "an elastic group (min, max) cannot keep strategy.tp/dp_replicate: Ray may start "
            "it at a size they do not divide; give a fixed number of workers",
        )
    if workers > 1:
        MeshShape.for_world(workers, strategy["tp"], strategy["dp_replicate"])
    for stage in ("train", "val", "test"):
        loader = cfg.get(f"{stage}_dataloader")
        if (
            strategy["tp"] > 1
            and isinstance(loader, dict)
            and loader.get("type") == "RayDataLoader"
        ):
            raise ConfigError(f"{stage}_dataloader.type", NOT_WITH_TP)


def _check_spec(reg: Any, spec: Any, key: str, supplied: tuple = ()) -> None:
    """A ``dict(type=...)`` resolves in ``reg`` and its arguments fit the constructor (anything
    else, e.g. an object already built, is left to the worker)."""
    if isinstance(spec, dict):
        if "type" not in spec:
            raise ConfigError(key, "missing 'type'")
        cls = reg.resolve(spec["type"], key)
        check_arguments(cls, {k: v for k, v in spec.items() if k != "type"}, key, supplied=supplied)


def _check_optim_parts(cfg: dict) -> None:
    """The optimizer, the paramwise options and the schedulers, resolved without a model."""
    optim = cfg.get("optim_wrapper")
    if isinstance(optim, dict):
        _check_spec(
            registry.OPTIMIZERS,
            optim.get("optimizer"),
            "optim_wrapper.optimizer",
            supplied=("params",),
        )
        if "paramwise_cfg" in optim or "constructor" in optim:
            from distributed_runner.optim.wrapper import constructor_for

            constructor_for(optim)  # checks its options without a model
    schedulers = cfg.get("param_scheduler")
    for i, sched in enumerate(schedulers if isinstance(schedulers, list) else [schedulers]):
        if isinstance(sched, dict) and "type" in sched:
            registry.PARAM_SCHEDULERS.resolve(sched["type"], f"param_scheduler[{i}]")
