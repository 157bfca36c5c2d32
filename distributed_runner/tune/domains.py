"""Search-space domains written as plain config data, checked before Ray starts.

A sweep's ``param_space`` maps a dotted config key to a domain,
``dict(type='loguniform', lower=1e-4, upper=1e-1)``, rather than to a ``ray.tune`` object: a
config file stays plain data (``drun hooks``, ``work_dir/config.py`` and MLflow params read it),
and every mistake — a misspelled bound, ``lower >= upper``, a log scale through zero — is one
line naming the key instead of a Ray traceback (or a silently empty space) minutes later. A
value that is not such a dict is a constant the trials all get.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from distributed_runner.core.errors import ConfigError, did_you_mean

# type -> (required keys, optional keys with defaults)
DOMAIN_KEYS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "uniform": (("lower", "upper"), {}),
    "quniform": (("lower", "upper", "q"), {}),
    "loguniform": (("lower", "upper"), {"base": 10}),
    "qloguniform": (("lower", "upper", "q"), {"base": 10}),
    "randint": (("lower", "upper"), {}),
    "qrandint": (("lower", "upper", "q"), {}),
    "lograndint": (("lower", "upper"), {"base": 10}),
    "randn": ((), {"mean": 0.0, "sd": 1.0}),
    "choice": (("categories",), {}),
    "grid_search": (("values",), {}),
}
INTEGER_DOMAINS = ("randint", "qrandint", "lograndint")


def is_domain(value: Any) -> bool:
    """Whether ``value`` is written as a domain (a dict with a ``type``), not a constant."""
    return isinstance(value, dict) and "type" in value


def _number(key: str, value: Any, integer: bool = False) -> float:
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        raise ConfigError(key, f"takes {'an integer' if integer else 'a number'}, got {value!r}")
    return float(value)


def check_domain(key: str, spec: Any) -> dict[str, Any]:
    """``spec`` with its defaults filled in, or a one-line ConfigError at ``key``."""
    if not is_domain(spec):
        if isinstance(spec, dict):
            raise ConfigError(
                key,
                f"a domain needs a type ({', '.join(DOMAIN_KEYS)}), e.g. "
                f"dict(type='loguniform', lower=1e-4, upper=1e-1); got {spec!r}",
            )
        return {"type": "constant", "value": spec}
    kind = spec["type"]
    if kind not in DOMAIN_KEYS:
        raise ConfigError(
            f"{key}.type",
            f"unknown domain {kind!r}{did_you_mean(str(kind), DOMAIN_KEYS)}; "
            f"one of {', '.join(DOMAIN_KEYS)}",
        )
    required, optional = DOMAIN_KEYS[kind]
    allowed = ("type", *required, *optional)
    for name in spec:
        if name not in allowed:
            raise ConfigError(
                f"{key}.{name}",
                f"{kind} has no option {name!r}{did_you_mean(name, allowed)}; it takes: "
                f"{', '.join(allowed[1:])}",
            )
    missing = [name for name in required if name not in spec]
    if missing:
        raise ConfigError(key, f"{kind} needs {', '.join(missing)}")
    out = {**optional, **spec}
    if kind in ("choice", "grid_search"):
        name = required[0]
        values = out[name]
        if not isinstance(values, (list, tuple)) or not values:
            raise ConfigError(f"{key}.{name}", f"takes a non-empty list, got {values!r}")
        out[name] = list(values)
        return out
    if kind == "randn":
        if _number(f"{key}.sd", out["sd"]) <= 0:
            raise ConfigError(f"{key}.sd", f"must be > 0, got {out['sd']!r}")
        _number(f"{key}.mean", out["mean"])
        return out
    integer = kind in INTEGER_DOMAINS
    lower = _number(f"{key}.lower", out["lower"], integer)
    upper = _number(f"{key}.upper", out["upper"], integer)
    if lower >= upper:
        raise ConfigError(key, f"lower ({out['lower']!r}) must be below upper ({out['upper']!r})")
    if kind.startswith(("log", "qlog")) and lower <= 0:
        raise ConfigError(
            f"{key}.lower", f"a log scale needs lower > 0, got {out['lower']!r} (use uniform)"
        )
    if "q" in out and _number(f"{key}.q", out["q"], integer) <= 0:
        raise ConfigError(f"{key}.q", f"must be > 0, got {out['q']!r}")
    if "base" in out and _number(f"{key}.base", out["base"]) <= 1:
        raise ConfigError(f"{key}.base", f"must be > 1, got {out['base']!r}")
    if kind == "randint" and upper - lower < 1:
        raise ConfigError(key, "randint samples from [lower, upper): the range holds no integer")
    return out


def to_tune(spec: dict[str, Any]) -> Any:
    """The ``ray.tune`` search-space object for a checked spec (a constant stays itself)."""
    from ray import tune

    kind = spec["type"]
    if kind == "constant":
        return spec["value"]
    args = {k: v for k, v in spec.items() if k != "type"}
    builders: dict[str, Callable[..., Any]] = {
        "uniform": tune.uniform,
        "quniform": tune.quniform,
        "loguniform": tune.loguniform,
        "qloguniform": tune.qloguniform,
        "randint": tune.randint,
        "qrandint": tune.qrandint,
        "lograndint": tune.lograndint,
        "randn": tune.randn,
        "choice": tune.choice,
        "grid_search": tune.grid_search,
    }
    if kind in ("choice", "grid_search"):
        return builders[kind](next(iter(args.values())))
    return builders[kind](**args)


def sample(spec: dict[str, Any], rng: Any) -> Any:
    """One value from ``spec`` without Ray (``--dry-run``): ``rng`` is a ``random.Random``."""
    kind = spec["type"]
    if kind == "constant":
        return spec["value"]
    if kind in ("choice", "grid_search"):
        return rng.choice(spec["categories" if kind == "choice" else "values"])
    if kind == "randn":
        return rng.gauss(spec["mean"], spec["sd"])
    lower, upper = spec["lower"], spec["upper"]
    if kind.startswith(("log", "qlog")):
        base = spec["base"]
        value = base ** rng.uniform(math.log(lower, base), math.log(upper, base))
    else:
        value = rng.uniform(lower, upper)
    if "q" in spec:
        value = round(value / spec["q"]) * spec["q"]
    return int(value) if kind in INTEGER_DOMAINS else value
