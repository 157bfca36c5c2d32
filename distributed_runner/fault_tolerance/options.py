"""The ``fault_tolerance`` config section: its options, and the checks the driver makes.

Parsed once (the sections table, engine/config_sections.py); the workers and the launcher read
the parsed value. torchft is an extra (``pip install 'distributed-runner[ft]'``): a config that
asks for fault tolerance without it is one line, on the driver.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from distributed_runner.core.errors import ConfigError, did_you_mean

DEFAULTS: dict[str, Any] = {
    "mode": "replicas",
    "replicas": None,
    "ranks_per_replica": 1,
    "min_replicas": 1,
    "heartbeat_timeout": 5.0,
    "join_timeout": 60.0,
    "quorum_timeout": 120.0,
    "timeout": 60.0,
    "max_replacements": 8,
    "lighthouse": None,
}
MODES = ("replicas",)
SECONDS = ("heartbeat_timeout", "join_timeout", "quorum_timeout", "timeout")


def parse_fault_tolerance(spec: Any) -> dict | None:
    """``fault_tolerance`` with its defaults, or None when the config does not ask for it.

    Args:
        mode (str): 'replicas': replica groups that agree on every step (torchft).
        replicas (int): how many replica groups the global batch is cut for (>= 2).
        ranks_per_replica (int): processes in each replica group (1: DDP, one process a
            replica; >= 2 with strategy='fsdp': the group shards the model, HSDP across groups).
        min_replicas (int): the fewest that may commit a step; below it the run falls back to
            a restart from the newest checkpoint.
        heartbeat_timeout (float): seconds without a heartbeat before a replica counts as lost.
        join_timeout (float): seconds a quorum waits for a replica that asked to join.
        quorum_timeout (float): seconds a replica waits for a quorum before it tries the step
            again (below watchdog.hang_timeout, as timeout is).
        timeout (float): seconds for a collective, a vote or a state transfer.
        max_replacements (int): replacements the launcher starts before it gives up.
        lighthouse (str | None): a running lighthouse's address; None: the launcher starts one.
    """
    if spec is None or spec is False:
        return None
    if not isinstance(spec, dict):
        raise ConfigError(
            "fault_tolerance", f"expected dict(mode='replicas', replicas=N, ...), got {spec!r}"
        )
    for key in spec:
        if key not in DEFAULTS:
            raise ConfigError(
                f"fault_tolerance.{key}",
                f"unknown option{did_you_mean(key, DEFAULTS)}; it takes {', '.join(DEFAULTS)}",
            )
    out = {**DEFAULTS, **spec}
    _check_counts(out)
    for key in SECONDS:
        value = out[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"fault_tolerance.{key}", f"must be seconds > 0, got {value!r}")
    return out


def _check_counts(out: dict) -> None:
    if out["mode"] not in MODES:
        raise ConfigError(
            "fault_tolerance.mode", f"unknown mode {out['mode']!r}: use {', '.join(MODES)}"
        )
    replicas, least = out["replicas"], out["min_replicas"]
    if not _whole(replicas) or replicas < 2:
        raise ConfigError(
            "fault_tolerance.replicas",
            f"must be the number of replica groups (an int >= 2), got {replicas!r}",
        )
    if not _whole(least) or not 1 <= least <= replicas:
        raise ConfigError(
            "fault_tolerance.min_replicas", f"must be an int in 1..{replicas}, got {least!r}"
        )
    if not _whole(out["ranks_per_replica"]) or out["ranks_per_replica"] < 1:
        raise ConfigError(
            "fault_tolerance.ranks_per_replica",
            f"must be the processes of one replica group (an int >= 1), got "
            f"{out['ranks_per_replica']!r}",
        )
    if not _whole(out["max_replacements"]) or out["max_replacements"] < 0:
        raise ConfigError("fault_tolerance.max_replacements", "must be an int >= 0")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def torchft_missing() -> bool:
    return importlib.util.find_spec("torchft") is None


def check_fault_tolerance(
    cfg: dict, options: dict | None, launcher: dict | None = None, watchdog: dict | None = None
) -> None:
    """What the driver refuses before any replica starts, each in one line: torchft absent, a
    strategy, launcher, loader or optimizer setting the replica step does not keep exact, waits
    for peers the hang watch would take for a hang (``launcher``: the parsed Ray launcher
    options, None for local processes; ``watchdog``: the parsed hang watch)."""
    if options is None:
        return
    _check_waits(options, watchdog)
    if torchft_missing():
        raise ConfigError("fault_tolerance", "needs torchft: pip install 'distributed-runner[ft]'")
    _check_strategy(cfg.get("strategy"), int(options["ranks_per_replica"]))
    _check_launcher(launcher, options)
    _check_loader(cfg.get("train_dataloader"))
    optim = cfg.get("optim_wrapper")
    if isinstance(optim, dict) and int(optim.get("accumulative_counts", 1)) != 1:
        raise ConfigError(
            "optim_wrapper.accumulative_counts",
            "fault_tolerance steps once per global batch: raise batch_size or replicas instead",
        )


def _check_waits(options: dict, watchdog: dict | None) -> None:
    """A replica waiting for a hung peer gives up a try after ``timeout`` / ``quorum_timeout``
    and tries again, its hang watch counting afresh; the hung peer's own watchdog ends it after
    ``hang_timeout``. So both waits are shorter than ``hang_timeout``: the hung one is evicted,
    the waiting ones are not."""
    if watchdog is None or not watchdog.get("enabled", True):
        return
    for key in ("timeout", "quorum_timeout"):
        if options[key] >= watchdog["hang_timeout"]:
            raise ConfigError(
                f"fault_tolerance.{key}",
                f"{options[key]:g} s is not below watchdog.hang_timeout "
                f"({watchdog['hang_timeout']:g} s): a replica waiting for a hung peer would be "
                f"called hung with it; lower it or raise hang_timeout",
            )


def _check_strategy(strategy: Any, ranks: int) -> None:
    """One process a replica trains the whole model (DDP's data parallelism across replicas);
    a group of ``ranks`` shards it with FSDP, and the replicas are HSDP's replicated dimension
    (so the strategy's own ``dp_replicate`` is theirs). TP inside a group is not built yet."""
    options = strategy if isinstance(strategy, dict) else {"type": strategy or "ddp"}
    kind = options.get("type", "ddp")
    if ranks == 1 and kind != "ddp":
        raise ConfigError(
            "fault_tolerance.ranks_per_replica",
            f"strategy={kind!r} shards the model over a replica group's processes: set "
            f"ranks_per_replica=2 or more (1 is a replica of one process, strategy='ddp')",
        )
    if ranks > 1 and kind != "fsdp":
        raise ConfigError(
            "strategy",
            f"a replica group of {ranks} processes shards its model: use "
            f"strategy=dict(type='fsdp') (HSDP: replicated across the groups)",
        )
    why = {
        "dp_replicate": "the replica groups are HSDP's replicated dimension (replicas=N)",
        "tp": "tensor parallelism inside a fault-tolerant replica group is not built yet",
        "pp": "pipeline stages inside a fault-tolerant replica group are not built yet",
    }
    for key, reason in why.items():
        if int(options.get(key, 1)) != 1:
            raise ConfigError(f"strategy.{key}", f"{reason}: leave it 1 under fault_tolerance")


def _check_launcher(launcher: dict | None, options: dict) -> None:
    """On Ray each replica group is ``ranks_per_replica`` actors of the worker group, which
    drun (not Ray Train) replaces: its size is fixed, and Ray Train's restart count has no
    say."""
    if launcher is None:
        return
    replicas, ranks = int(options["replicas"]), int(options["ranks_per_replica"])
    workers = launcher["num_workers"]
    if isinstance(workers, tuple):
        raise ConfigError(
            "launcher.num_workers",
            f"fault_tolerance keeps its global batch over a fixed number of replicas: set "
            f"num_workers={replicas} (an elastic group resizes by restarts instead)",
        )
    if workers != replicas * ranks:
        per = "one worker a replica" if ranks == 1 else f"{ranks} workers a replica"
        raise ConfigError(
            "launcher.num_workers",
            f"fault_tolerance on Ray runs {per}: set num_workers={replicas * ranks} "
            f"(fault_tolerance.replicas x ranks_per_replica)",
        )
    if launcher["max_failures"]:
        raise ConfigError(
            "launcher.max_failures",
            "a fault-tolerant run replaces a lost replica itself, without Ray Train's group "
            "restart: set fault_tolerance.max_replacements instead",
        )


def _check_loader(loader: Any) -> None:
    """The replica step reads a missing slot's share itself: DefaultSampler over a map-style
    dataset, whose order is a function of the seed, the epoch and the position."""
    if not isinstance(loader, dict):
        return
    if loader.get("type") in ("StreamingLoader", "RayDataLoader"):
        raise ConfigError(
            "train_dataloader.type",
            "fault_tolerance needs a DataLoader with DefaultSampler over a map-style dataset",
        )
    sampler = loader.get("sampler") or {}
    if isinstance(sampler, dict) and sampler.get("type", "DefaultSampler") != "DefaultSampler":
        raise ConfigError(
            "train_dataloader.sampler",
            "fault_tolerance needs DefaultSampler: a missing replica's share is read by its "
            "position in the epoch's order",
        )
