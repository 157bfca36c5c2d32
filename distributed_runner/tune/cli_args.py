"""``drun tune``'s flags (the subcommand's parser; its body is :mod:`.driver`)."""

from __future__ import annotations

import argparse
import inspect
from typing import Any

from distributed_runner.core.errors import ConfigError
from distributed_runner.tune.algorithms import SCHEDULERS, SEARCHERS, algorithm_class


def add_tune_parser(sub: Any, add_common: Any) -> argparse.ArgumentParser:
    """Add ``drun tune`` to the subparsers ``sub`` (``add_common`` adds CONFIG, --work-dir,
    --cfg-options)."""
    tune = sub.add_parser(
        "tune", help="sweep a config's hyperparameters with Ray Tune (the config's tune=dict(...))"
    )
    add_common(tune)
    tune.add_argument("--num-samples", type=int, help="overrides tune.num_samples")
    tune.add_argument(
        "--max-concurrent-trials", type=int, help="overrides tune.max_concurrent_trials"
    )
    tune.add_argument(
        "--scheduler",
        metavar="|".join(SCHEDULERS),
        help="overrides tune.scheduler's type (its options stay when the type is the same)",
    )
    tune.add_argument(
        "--search-alg",
        metavar="|".join(SEARCHERS),
        help="overrides tune.search_alg's type (its options stay when the type is the same)",
    )
    tune.add_argument(
        "--trial-launcher", choices=["none", "ray"], help="overrides tune.trial_launcher"
    )
    tune.add_argument("--num-workers", type=int, help="workers per trial (--trial-launcher ray)")
    tune.add_argument("--gpu", action="store_true", default=None, help="one GPU per worker")
    tune.add_argument("--address", help="'auto' or HOST:PORT: join a running Ray cluster")
    tune.add_argument("--resume", action="store_true", help="continue the sweep in --work-dir")
    tune.add_argument(
        "--dry-run", action="store_true", help="check the sweep and show a few trials' values"
    )
    return tune


def _accepts(table: dict, kind: str) -> set[str] | None:
    """The option names of ``kind``'s class (None when ``kind`` is not in ``table``)."""
    by_lower = {name.lower(): name for name in table}
    if str(kind).lower() not in by_lower:
        return None
    cls = algorithm_class(table, by_lower[str(kind).lower()])
    return set(inspect.signature(cls).parameters)


def _override_type(current: Any, kind: str, table: dict) -> dict:
    """``current`` with type ``kind``: the old type's own options go (they would not fit the new
    one); any other option stays, so that a misspelled one is still reported."""
    spec = {"type": current} if isinstance(current, str) else dict(current or {})
    old = spec.get("type")
    spec["type"] = kind
    if str(old).lower() != kind.lower():
        old_names = _accepts(table, str(old)) or set()
        new_names = _accepts(table, kind) or set()
        spec = {k: v for k, v in spec.items() if k not in old_names or k in new_names}
    return spec


def apply_tune_flags(cfg: dict, args: argparse.Namespace) -> None:
    """The flags over the config's ``tune`` block (and ``launcher`` for Ray Train trials)."""
    block = cfg.get("tune")
    if not isinstance(block, dict):
        raise ConfigError("tune", "the config has no tune=dict(metric=..., param_space=...)")
    block = dict(block)
    if args.num_samples is not None:
        block["num_samples"] = args.num_samples
    if args.max_concurrent_trials is not None:
        block["max_concurrent_trials"] = args.max_concurrent_trials
    if args.scheduler:
        block["scheduler"] = _override_type(block.get("scheduler"), args.scheduler, SCHEDULERS)
    if args.search_alg:
        block["search_alg"] = _override_type(block.get("search_alg"), args.search_alg, SEARCHERS)
    if args.trial_launcher:
        block["trial_launcher"] = args.trial_launcher
    cfg["tune"] = block
    flags = {"num_workers": args.num_workers, "use_gpu": args.gpu}
    flags = {k: v for k, v in flags.items() if v is not None}
    if flags:
        if block.get("trial_launcher", "none") != "ray":
            raise ConfigError("--num-workers", "sizes Ray Train trials: add --trial-launcher ray")
        launcher = cfg.get("launcher")
        base = dict(launcher) if isinstance(launcher, dict) else {}
        cfg["launcher"] = {**base, "type": "ray", **flags}
