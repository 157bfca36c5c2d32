"""Schedulers and search algorithms by our own names, their options checked against the classes.

Ray's ``tune.create_scheduler(name, **kwargs)`` drops options it does not know without a word
(``max_tt=10`` leaves ``max_t=100``), and its names are not the ones users write (``'asha'`` is
not one). So a sweep names them here (:data:`SCHEDULERS`, :data:`SEARCHERS`), case-insensitively,
and every option is matched against the class's signature before Ray starts: a misspelled option
is one line with a suggestion, never a feature quietly left at its default.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from distributed_runner.core.errors import ConfigError, did_you_mean
from distributed_runner.core.signatures import check_arguments

# our name -> (module, class); imported only when a sweep checks or builds one
SCHEDULERS: dict[str, tuple[str, str]] = {
    "fifo": ("ray.tune.schedulers", "FIFOScheduler"),
    "ASHA": ("ray.tune.schedulers", "AsyncHyperBandScheduler"),
    "median": ("ray.tune.schedulers", "MedianStoppingRule"),
    "PBT": ("ray.tune.schedulers", "PopulationBasedTraining"),
    "PB2": ("ray.tune.schedulers.pb2", "PB2"),
}
SEARCHERS: dict[str, tuple[str, str]] = {
    "random": ("ray.tune.search.basic_variant", "BasicVariantGenerator"),
    "grid": ("ray.tune.search.basic_variant", "BasicVariantGenerator"),
    "optuna": ("ray.tune.search.optuna", "OptunaSearch"),
    "hyperopt": ("ray.tune.search.hyperopt", "HyperOptSearch"),
}
# what a searcher needs installed, and how to get it
EXTRAS = {"optuna": "optuna", "hyperopt": "hyperopt", "PB2": "sklearn"}
INSTALL = {"optuna": "optuna>=5", "hyperopt": "hyperopt>=0.3", "sklearn": "scikit-learn"}
# set by the sweep from tune.metric / tune.mode / param_space, never in the option dicts
SWEEP_OWNED = ("metric", "mode", "space", "max_concurrent")


def canonical(kind: str, table: dict[str, Any], key: str) -> str:
    """The table's spelling of ``kind`` (case-insensitive), or a one-line error at ``key``."""
    by_lower = {name.lower(): name for name in table}
    found = by_lower.get(str(kind).lower())
    if found is None:
        raise ConfigError(
            key, f"unknown {kind!r}{did_you_mean(str(kind), table)}; one of {', '.join(table)}"
        )
    return found


def require_installed(kind: str, key: str) -> None:
    """A one-line error when ``kind`` needs a package that is not installed."""
    module = EXTRAS.get(kind)
    if module and importlib.util.find_spec(module) is None:
        raise ConfigError(
            key,
            f"{kind!r} needs {module}: pip install '{INSTALL[module]}' "
            f"(or pip install -e '.[tune]')",
        )


def algorithm_class(table: dict[str, tuple[str, str]], kind: str) -> type:
    module, name = table[kind]
    return getattr(importlib.import_module(module), name)


def check_options(cls: type, options: dict[str, Any], key: str) -> None:
    """Every option is an argument of ``cls`` (did-you-mean otherwise); the sweep's own
    (``metric``, ``mode``, ...) are refused with where to set them."""
    for name in options:
        if name in SWEEP_OWNED:
            where = "tune.param_space" if name == "space" else f"tune.{name}"
            if name == "max_concurrent":
                where = "tune.max_concurrent_trials"
            raise ConfigError(f"{key}.{name}", f"is set by the sweep: use {where}")
    check_arguments(cls, options, key)


def build_scheduler(kind: str, options: dict[str, Any], metric: str, mode: str) -> Any:
    """The scheduler object (options already checked and completed)."""
    cls = algorithm_class(SCHEDULERS, kind)
    if kind == "fifo":
        return cls()
    return cls(metric=metric, mode=mode, **options)


def build_searcher(
    kind: str, options: dict[str, Any], metric: str, mode: str, concurrency: int
) -> Any:
    """The search algorithm object (options already checked). Ray's variant generator takes the
    concurrency limit itself: given one, Tune does not apply ``max_concurrent_trials`` to it
    (measured: two trials ran at once with the limit at 1)."""
    cls = algorithm_class(SEARCHERS, kind)
    if kind in ("random", "grid"):
        return cls(max_concurrent=concurrency, **options)
    return cls(metric=metric, mode=mode, **options)
