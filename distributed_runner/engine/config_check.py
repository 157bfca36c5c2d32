"""Types and ranges of the engine-owned config keys, checked before anything is built.

Why a checker of its own: the values flow into ``int()``, ``torch.device``, ``DataLoader`` and
optimizers, which either raise from deep inside (a traceback instead of a line a user can act on)
or quietly coerce (``max_epochs='12'`` or ``12.5`` or ``True`` trained; ``val_interval=0`` never
validated). Every key here is checked for its type *and* range, and a mistake is one
:class:`~distributed_runner.core.errors.ConfigError` naming the key path, what it got and what it
takes. It runs in :func:`~distributed_runner.engine.config_prep.prepare_config` — in
:meth:`Runner.from_cfg` and on the Ray driver — so a bad config never reaches a worker. The
shapes of ``default_hooks`` and ``custom_hooks`` are the hook builder's to check (every path goes
through it, ``drun hooks`` and a Runner built in Python included).

The user's own objects (models, datasets, metrics, hooks) check their own arguments; an
exception their constructors raise is wrapped into one line by the registries.

Top-level keys the Runner does not know are allowed — MMEngine configs keep helper variables
(``data_root = ...``) at the top — unless the name is a near-miss of one the Runner knows
(``trian_cfg``): a typo must not silently turn a feature off.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from difflib import SequenceMatcher
from typing import Any

from distributed_runner.core.config_values import (
    boolean,
    is_int,
    mapping,
    number,
    positive_int,
    show_value,
)
from distributed_runner.core.errors import ConfigError

# The sections a subsystem owns (strategy, watchdog, val_cfg's mode, compile, preemption,
# load_from, launcher) are parsed by their owners' parsers from the sections table
# (engine/sections.py), right after these checks, in prepare_config.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def check_config(cfg: dict, runner_keys: Iterable[str], other_keys: Iterable[str]) -> None:
    """Raise one ConfigError for the first engine-owned key with a wrong type or range."""
    _check_mmcv1_keys(cfg)
    _check_top_level(cfg, tuple(runner_keys) + tuple(other_keys))
    work_dir = cfg.get("work_dir")
    if work_dir is not None and not isinstance(work_dir, (str, os.PathLike)):
        raise ConfigError("work_dir", f"got {show_value(work_dir)}; takes a path string")
    level = cfg.get("log_level", "INFO")
    if not (isinstance(level, str) and level.upper() in LOG_LEVELS) and not is_int(level):
        raise ConfigError(
            "log_level", f"got {show_value(level)}; takes one of {', '.join(LOG_LEVELS)}"
        )
    _check_device(cfg.get("device"))
    randomness = mapping(cfg, "randomness")
    if randomness is not None:
        if randomness.get("seed") is not None:
            positive_int(randomness, "seed", "randomness", minimum=0)
        boolean(randomness, "deterministic", "randomness")
        boolean(randomness, "diff_rank_seed", "randomness")
    train_cfg = mapping(cfg, "train_cfg")
    if train_cfg is not None:
        check_train_cfg(train_cfg)
    for stage in ("val_cfg", "test_cfg"):
        mapping(cfg, stage)
    for stage in ("train", "val", "test"):
        loader = cfg.get(f"{stage}_dataloader")
        if isinstance(loader, dict):
            _check_loader(loader, f"{stage}_dataloader")
    optim = mapping(cfg, "optim_wrapper")
    if optim is not None:
        _check_optim(optim)


def check_train_cfg(train_cfg: dict) -> None:
    """The training loop's keys of ``train_cfg``: ``by_epoch``, the length (``max_epochs`` /
    ``max_iters``), ``val_interval``, ``val_begin`` and ``agree_every``.

    A function of its own so that the one rule also serves a training loop built without a config
    (a Runner constructed in Python never passes :func:`check_config`).

    Args:
        by_epoch (bool): count training in epochs (EpochBasedTrainLoop) or iterations.
        max_epochs (int): epochs to train, with ``by_epoch=True``.
        max_iters (int): iterations (optimizer steps) to train, with ``by_epoch=False``.
        val_interval (int): validate every this many epochs (iterations), and at the end.
        val_begin (int): the first epoch (iteration) after which validation may run.
        agree_every (int | 'auto'): how often ranks agree on hooks' requests; 'auto' sizes it
            to the step time.
    """
    boolean(train_cfg, "by_epoch", "train_cfg")
    for name in ("max_epochs", "max_iters", "val_interval", "val_begin"):
        positive_int(train_cfg, name, "train_cfg")
    positive_int(train_cfg, "agree_every", "train_cfg", allowed=("auto",))


# MMCV 1.x (MMDetection 2.x, iMIX) top-level keys the Runner would ignore -> what replaced them
MMCV1_KEYS = {
    "optimizer": "optim_wrapper=dict(optimizer=dict(type=..., lr=...))",
    "optimizer_config": "optim_wrapper=dict(optimizer=..., clip_grad=dict(max_norm=...), "
    "accumulative_counts=N) (AMP: type='AmpOptimWrapper')",
    "lr_config": "param_scheduler=[dict(type='LinearLR', ...), dict(type='MultiStepLR', ...)]",
    "momentum_config": "param_scheduler=[...] (momentum schedulers)",
    "checkpoint_config": "default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=...))",
    "log_config": "default_hooks=dict(logger=dict(type='LoggerHook', interval=...))",
    "evaluation": "train_cfg=dict(val_interval=N) with val_dataloader, val_evaluator and "
    "val_cfg; save_best is CheckpointHook's",
    "runner": "train_cfg=dict(by_epoch=True, max_epochs=N) (or by_epoch=False, max_iters=N)",
    "total_epochs": "train_cfg=dict(max_epochs=N)",
    "resume_from": "resume='<checkpoint path>' (or resume=True for the newest in work_dir)",
    "workflow": "train_cfg / val_cfg / test_cfg (validation: train_cfg.val_interval)",
    "data": "train_dataloader=dict(batch_size=..., num_workers=..., dataset=...), "
    "val_dataloader=..., test_dataloader=...",
}


def _check_mmcv1_keys(cfg: dict) -> None:
    """An MMCV 1.x key would be ignored here, and its feature silently off: one line that says
    what replaced it. ``optimizer = dict(...)`` beside ``optim_wrapper`` is MMEngine's own helper
    variable pattern and ``data`` is one unless it is MMCV's loader dict; both are left alone."""
    for key, instead in MMCV1_KEYS.items():
        if key not in cfg:
            continue
        value = cfg[key]
        if key == "optimizer" and "optim_wrapper" in cfg:
            continue
        if key == "data" and not (
            isinstance(value, dict)
            and {"train", "val", "test", "samples_per_gpu", "workers_per_gpu"} & set(value)
        ):
            continue
        if key == "runner" and not (
            isinstance(value, dict) and "Runner" in str(value.get("type", ""))
        ):
            continue
        raise ConfigError(
            key, f"is an MMCV 1.x key this Runner (MMEngine's layout) would ignore; use {instead}"
        )


NEAR_MISS = 0.82  # trian_cfg ~ train_cfg 0.89; data_root ~ default_hooks 0.55, norm_cfg 0.67


def _check_top_level(cfg: dict, known: tuple[str, ...]) -> None:
    for key in cfg:
        if not isinstance(key, str) or key in known or key.startswith("_"):
            continue
        near = max(known, key=lambda k: SequenceMatcher(None, key, k).ratio())
        if SequenceMatcher(None, key, near).ratio() >= NEAR_MISS:
            raise ConfigError(
                key,
                f"not a config key the Runner takes; did you mean {near!r}? "
                f"(helper variables are fine; near-misses of the Runner's "
                f"keys are refused so a typo cannot switch a part off)",
            )


def _check_device(device: Any) -> None:
    if device is None:
        return
    import torch

    if not isinstance(device, (str, torch.device)):
        raise ConfigError(
            "device", f"got {show_value(device)}; takes 'cpu', 'cuda', 'cuda:N' or None (automatic)"
        )
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError(
            "device", f"got {show_value(device)}; takes 'cpu', 'cuda', 'cuda:N' or None (automatic)"
        ) from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                "device",
                f"{device!r} but this machine has no usable CUDA GPU "
                f"(or torch is a CPU build): use device='cpu' or leave "
                f"it unset",
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ConfigError(
                "device", f"{device!r} but this machine has {torch.cuda.device_count()} GPU(s)"
            )


def _check_loader(loader: dict, key: str) -> None:
    positive_int(loader, "batch_size", key)
    positive_int(loader, "num_workers", key, minimum=0)
    positive_int(loader, "prefetch_factor", key)
    for name in ("drop_last", "pin_memory", "persistent_workers"):
        boolean(loader, name, key)
    dataset = loader.get("dataset")
    if (
        dataset is not None
        and not isinstance(dataset, dict)
        and not hasattr(dataset, "__getitem__")
    ):
        raise ConfigError(
            f"{key}.dataset", f"got {show_value(dataset)}; takes dict(type=...) or a dataset object"
        )


def _check_optim(optim: dict) -> None:
    optimizer = optim.get("optimizer")
    if isinstance(optimizer, dict):
        number(optimizer, "lr", "optim_wrapper.optimizer")
        number(optimizer, "weight_decay", "optim_wrapper.optimizer")
        number(optimizer, "momentum", "optim_wrapper.optimizer")
    elif optimizer is not None and not hasattr(optimizer, "step"):
        raise ConfigError(
            "optim_wrapper.optimizer",
            f"got {show_value(optimizer)}; takes dict(type='SGD', lr=...) or an optimizer",
        )
    positive_int(optim, "accumulative_counts", "optim_wrapper")
    clip = optim.get("clip_grad")
    if clip is not None:
        if not isinstance(clip, dict):
            raise ConfigError(
                "optim_wrapper.clip_grad",
                f"got {show_value(clip)}; takes None or dict(max_norm=1.0)",
            )
        number(clip, "max_norm", "optim_wrapper.clip_grad", exclusive=True)
