"""``tune=dict(...)``: a sweep's keys, their defaults and every check, run before Ray starts.

The keys (``drun tune``'s flags override them):

* ``metric`` (required): a key the ``val_evaluator`` reports, checked as CheckpointHook's
  ``save_best`` is; ``mode`` ``'max'``/``'min'`` (default: inferred from the name, like
  ``save_best``'s rule).
* ``param_space``: dotted config keys, as ``--cfg-options`` (list indices allowed), to domains
  (:mod:`.domains`) or constants.
* ``num_samples`` (1): trials drawn (times the grid, for ``grid_search`` domains).
* ``search_alg`` (``dict(type='random')``): ``'random'``, ``'grid'``, ``'optuna'``, ``'hyperopt'``
  and their options; ``scheduler`` (``dict(type='fifo')``): ``'ASHA'``, ``'median'``, ``'PBT'``,
  ``'PB2'``, ``'fifo'`` and their options (:mod:`.algorithms`; ``time_attr`` defaults to
  ``'epoch'`` or ``'iter'``, ASHA's ``max_t`` to the run's length).
* ``trial_launcher`` (``'none'``): the Runner inside the trial's process, or ``'ray'``: each
  trial a Ray Train run with the config's ``launcher``.
* ``max_concurrent_trials`` (None: as many as fit), ``resources_per_trial`` (None:
  ``dict(CPU=1)`` for in-process trials), ``stop_grace_s`` (120: how long a stopped trial may take
  to finish its ``after_train``), ``max_failures`` (0), ``time_budget_s`` (None), ``name`` (the
  work_dir's folder name), ``storage_path`` (``work_dir/tune_storage``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from distributed_runner.core.errors import ConfigError, check_known_keys, did_you_mean
from distributed_runner.evaluation.metric_rules import infer_rule
from distributed_runner.tune import algorithms
from distributed_runner.tune.domains import check_domain
from distributed_runner.tune.mutations import MUTABLE_KEYS

TUNE_DEFAULTS: dict[str, Any] = {
    "metric": None,
    "mode": None,
    "param_space": {},
    "num_samples": 1,
    "search_alg": {"type": "random"},
    "scheduler": {"type": "fifo"},
    "trial_launcher": "none",
    "max_concurrent_trials": None,
    "resources_per_trial": None,
    "stop_grace_s": 120.0,
    "max_failures": 0,
    "time_budget_s": None,
    "name": None,
    "storage_path": None,
}
TRIAL_LAUNCHERS = ("none", "ray")


@dataclass
class SweepSpec:
    """A checked ``tune`` block (see the module docstring)."""

    metric: str
    mode: str
    space: dict[str, dict[str, Any]]
    num_samples: int
    search_alg: str
    search_options: dict[str, Any]
    scheduler: str
    scheduler_options: dict[str, Any]
    trial_launcher: str
    max_concurrent_trials: int | None
    resources_per_trial: dict[str, float] | None
    stop_grace_s: float
    max_failures: int
    time_budget_s: float | None
    name: str | None
    storage_path: str | None
    time_attr: str = "epoch"
    extra: dict[str, Any] = field(default_factory=dict)


def _positive_int(key: str, value: Any, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, f"takes a positive integer, got {value!r}")
    return value


def check_dotted_key(cfg: dict, dotted: str, key: str) -> None:
    """``dotted`` names a place in ``cfg`` (every part but the last exists; the last exists too
    unless its parent is a ``dict(type=...)``, whose arguments the config check matches against
    the constructor); a one-line error with a suggestion otherwise."""
    parts = dotted.split(".")
    node: Any = cfg
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        where = ".".join(parts[:i]) or "the config"
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    key, f"{part!r} is not an index of {where} (a list of {len(node)})"
                )
            node = node[int(part)]
        elif isinstance(node, dict):
            if part not in node:
                if last and "type" in node:
                    return  # an argument the object may take: checked with its constructor
                raise ConfigError(
                    key,
                    f"{where} has no key {part!r}{did_you_mean(part, [str(k) for k in node])}",
                )
            node = node[part]
        else:
            raise ConfigError(key, f"{where} is a {type(node).__name__}, not a dict or a list")


def _train_shape(cfg: dict) -> tuple[bool, int, int]:
    """(by_epoch, length in epochs or iterations, val_interval) of the config's training."""
    train_cfg = cfg.get("train_cfg") or {}
    by_epoch = bool(train_cfg.get("by_epoch", "max_iters" not in train_cfg))
    length = train_cfg.get("max_epochs" if by_epoch else "max_iters") or 0
    return by_epoch, int(length), int(train_cfg.get("val_interval", 1) or 1)


def _check_metric(cfg: dict, metric: Any) -> str:
    if not isinstance(metric, str) or not metric:
        raise ConfigError("tune.metric", "name a metric the val_evaluator reports, e.g. 'accuracy'")
    if not all(cfg.get(k) is not None for k in ("val_dataloader", "val_evaluator", "val_cfg")):
        raise ConfigError(
            "tune.metric",
            "the config has no validation (val_dataloader, val_evaluator, val_cfg): trials "
            "report what each validation measures",
        )
    from distributed_runner.evaluation.evaluator import Evaluator
    from distributed_runner.evaluation.metric_rules import require_metric

    names = Evaluator.build(cfg["val_evaluator"], "val_evaluator").metric_names()
    require_metric("tune.metric", metric, names)
    return metric


def _check_mode(metric: str, mode: Any) -> str:
    if mode is None:
        rule = infer_rule(metric)
        if rule is None:
            raise ConfigError(
                "tune.mode",
                f"cannot tell whether a larger {metric!r} is better: set 'max' or 'min'",
            )
        return "max" if rule == "greater" else "min"
    if mode not in ("max", "min"):
        raise ConfigError("tune.mode", f"takes 'max' or 'min', got {mode!r}")
    return str(mode)


def _check_mutations(cfg: dict, kind: str, options: dict, space: dict) -> None:
    """PBT's ``hyperparam_mutations`` / PB2's ``hyperparam_bounds``: mutable dotted keys only."""
    name = "hyperparam_mutations" if kind == "PBT" else "hyperparam_bounds"
    mutations = options.get(name)
    if not isinstance(mutations, dict) or not mutations:
        raise ConfigError(
            f"tune.scheduler.{name}",
            f"{kind} needs {name}={{'optim_wrapper.optimizer.lr': ...}}: what it may change",
        )
    checked: dict[str, Any] = {}
    for dotted, spec in mutations.items():
        key = f"tune.scheduler.{name}.{dotted}"
        check_dotted_key(cfg, dotted, key)
        if dotted not in MUTABLE_KEYS:
            raise ConfigError(
                key,
                f"cannot change mid-run (an exploited trial continues the donor's run from its "
                f"checkpoint); {kind} may mutate only {', '.join(MUTABLE_KEYS)}",
            )
        if kind == "PB2":
            if not (isinstance(spec, (list, tuple)) and len(spec) == 2) or not spec[0] < spec[1]:
                raise ConfigError(key, f"takes [lower, upper] with lower < upper, got {spec!r}")
            checked[dotted] = [float(spec[0]), float(spec[1])]
            space.setdefault(dotted, {"type": "uniform", "lower": spec[0], "upper": spec[1]})
            continue
        as_domain = (
            {"type": "choice", "categories": list(spec)}
            if isinstance(spec, (list, tuple))
            else spec
        )
        domain = check_domain(key, as_domain)
        if domain["type"] in ("constant", "grid_search"):
            raise ConfigError(key, "takes a domain (e.g. loguniform) or a list of values")
        checked[dotted] = domain
        space.setdefault(dotted, domain)
    options[name] = checked


def _algorithm(spec: Any, table: dict, key: str, example: str) -> tuple[str, dict]:
    """``dict(type=..., **options)`` (or the bare name) of a scheduler or searcher: its canonical
    name and its options, checked against the class (Ray would drop a misspelled one)."""
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(key, f"takes dict(type={example!r}, ...), got {spec!r}")
    kind = algorithms.canonical(spec["type"], table, f"{key}.type")
    algorithms.require_installed(kind, f"{key}.type")
    options = {k: v for k, v in spec.items() if k != "type"}
    algorithms.check_options(algorithms.algorithm_class(table, kind), options, key)
    return kind, options


def _check_scheduler(cfg: dict, spec: Any, space: dict) -> tuple[str, dict, str]:
    kind, options = _algorithm(spec, algorithms.SCHEDULERS, "tune.scheduler", "ASHA")
    by_epoch, length, val_interval = _train_shape(cfg)
    unit = "epoch" if by_epoch else "iter"
    time_attr = options.setdefault("time_attr", unit) if kind != "fifo" else unit
    if kind != "fifo" and time_attr not in ("epoch", "iter", "training_iteration"):
        raise ConfigError(
            "tune.scheduler.time_attr",
            f"takes 'epoch', 'iter' or 'training_iteration' (reports), got {time_attr!r}",
        )
    if kind == "ASHA":
        options.setdefault("grace_period", 1)
        options.setdefault("stop_last_trials", False)
        if time_attr == unit:
            options.setdefault("max_t", length)
            if options["max_t"] > length:
                raise ConfigError(
                    "tune.scheduler.max_t",
                    f"{options['max_t']} is beyond the run's {length} {unit}s (train_cfg)",
                )
        if not 0 < options["grace_period"] <= options.get("max_t", 100):
            raise ConfigError("tune.scheduler.grace_period", "must be > 0 and <= max_t")
        if options.get("reduction_factor", 4) <= 1:
            raise ConfigError("tune.scheduler.reduction_factor", "must be > 1")
    if kind == "median":
        options.setdefault("grace_period", 1)
        options.setdefault("min_samples_required", 2)
    if kind in ("PBT", "PB2"):
        interval = options.get("perturbation_interval")
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            raise ConfigError(
                "tune.scheduler.perturbation_interval",
                f"takes a positive number of {time_attr}s, got {interval!r}",
            )
        if time_attr == unit and interval % val_interval:
            raise ConfigError(
                "tune.scheduler.perturbation_interval",
                f"{interval} is not a multiple of train_cfg.val_interval ({val_interval}): "
                f"trials report at validations",
            )
        _check_mutations(cfg, kind, options, space)
    return kind, options, time_attr


def _check_searcher(spec: Any, space: dict) -> tuple[str, dict]:
    kind, options = _algorithm(spec, algorithms.SEARCHERS, "tune.search_alg", "random")
    kinds = {key: d["type"] for key, d in space.items()}
    if kind == "grid":
        for key, domain in space.items():
            if domain["type"] == "choice":  # a grid walks every category
                space[key] = {"type": "grid_search", "values": domain["categories"]}
            elif domain["type"] not in ("grid_search", "constant"):
                raise ConfigError(
                    f"tune.param_space.{key}",
                    f"search_alg 'grid' takes grid_search or choice domains, not {domain['type']}",
                )
    if kind in ("optuna", "hyperopt"):
        grids = [key for key, t in kinds.items() if t == "grid_search"]
        if grids:
            raise ConfigError(
                f"tune.param_space.{grids[0]}",
                f"{kind} does not walk grids: use choice (or search_alg 'grid')",
            )
    return kind, options


def _check_resources(value: Any) -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        raise ConfigError("tune.resources_per_trial", f"takes dict(CPU=1, GPU=0), got {value!r}")
    for name, amount in value.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise ConfigError(
                f"tune.resources_per_trial.{name}", f"takes a number >= 0, got {amount!r}"
            )
    if not any(value.values()):
        raise ConfigError("tune.resources_per_trial", "a trial needs some resource (e.g. CPU=1)")
    return {str(k): float(v) for k, v in value.items()}


def _tune_options(cfg: dict) -> dict[str, Any]:
    """The ``tune`` block over TUNE_DEFAULTS, deep-copied so checks may rewrite it safely."""
    block = cfg.get("tune")
    if not isinstance(block, dict):
        raise ConfigError(
            "tune", f"a sweep needs tune=dict(metric=..., param_space=...), got {block!r}"
        )
    check_known_keys(block, TUNE_DEFAULTS, "tune")
    return {**copy.deepcopy(TUNE_DEFAULTS), **copy.deepcopy(dict(block))}


def _check_param_space(cfg: dict, param_space: Any) -> dict[str, dict[str, Any]]:
    """``tune.param_space``: each dotted key must name a config place, each value a domain."""
    if not isinstance(param_space, dict):
        raise ConfigError("tune.param_space", "takes {'dotted.config.key': dict(type=...), ...}")
    space: dict[str, dict[str, Any]] = {}
    for dotted, spec in param_space.items():
        key = f"tune.param_space.{dotted}"
        check_dotted_key(cfg, str(dotted), key)
        space[str(dotted)] = check_domain(key, spec)
    return space


def _check_trial_launcher(cfg: dict, launcher: Any) -> None:
    """``tune.trial_launcher``: a known name; 'ray' also needs the config's Ray launcher."""
    if launcher not in TRIAL_LAUNCHERS:
        raise ConfigError(
            "tune.trial_launcher",
            f"unknown {launcher!r}{did_you_mean(str(launcher), TRIAL_LAUNCHERS)}; "
            f"'none' (the Runner in the trial) or 'ray' (a Ray Train run per trial)",
        )
    # whether the config runs on Ray only: each trial's config parses its launcher section once
    if launcher == "ray":
        from distributed_runner.core.config import runs_in_process

        if runs_in_process(cfg.get("launcher")):
            raise ConfigError(
                "tune.trial_launcher",
                "'ray' runs each trial with the config's launcher: set launcher=dict(type='ray', "
                "num_workers=N) or pass --num-workers N",
            )


def _check_trial_limits(opts: dict[str, Any]) -> tuple[int | float, int, int | float | None]:
    """(stop_grace_s, max_failures, time_budget_s), checked here so a bad one fails before Ray."""
    grace = opts["stop_grace_s"]
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace <= 0:
        raise ConfigError("tune.stop_grace_s", f"takes seconds (> 0), got {grace!r}")
    failures = opts["max_failures"]
    if isinstance(failures, bool) or not isinstance(failures, int) or failures < -1:
        raise ConfigError("tune.max_failures", f"takes an integer >= -1, got {failures!r}")
    budget = opts["time_budget_s"]
    if budget is not None and (not isinstance(budget, (int, float)) or budget <= 0):
        raise ConfigError("tune.time_budget_s", f"takes seconds (> 0) or None, got {budget!r}")
    return grace, failures, budget


def parse_tune(cfg: dict) -> SweepSpec:
    """The checked sweep of ``cfg`` (its ``tune`` block); every mistake is one ConfigError."""
    opts = _tune_options(cfg)
    metric = _check_metric(cfg, opts["metric"])
    mode = _check_mode(metric, opts["mode"])
    space = _check_param_space(cfg, opts["param_space"])
    scheduler, scheduler_options, time_attr = _check_scheduler(cfg, opts["scheduler"], space)
    if not space:
        raise ConfigError("tune.param_space", "is empty: name at least one key to sweep")
    search_alg, search_options = _check_searcher(opts["search_alg"], space)
    _check_trial_launcher(cfg, opts["trial_launcher"])
    grace, failures, budget = _check_trial_limits(opts)
    return SweepSpec(
        metric=metric,
        mode=mode,
        space=space,
        num_samples=int(_positive_int("tune.num_samples", opts["num_samples"]) or 1),
        search_alg=search_alg,
        search_options=search_options,
        scheduler=scheduler,
        scheduler_options=scheduler_options,
        trial_launcher=str(opts["trial_launcher"]),
        max_concurrent_trials=_positive_int(
            "tune.max_concurrent_trials", opts["max_concurrent_trials"], allow_none=True
        ),
        resources_per_trial=_check_resources(opts["resources_per_trial"]),
        stop_grace_s=float(grace),
        max_failures=failures,
        time_budget_s=budget,
        name=opts["name"],
        storage_path=opts["storage_path"],
        time_attr=time_attr,
    )
