"""The model as the Ray driver checks it: built on the meta device (shapes, no memory) and put
through every check a worker makes before it allocates anything.

Why on the driver: a refusal only a built model can give (a tensor-parallel plan that does not fit
the model, a LoRA target it lacks, a ``load_from`` directory whose names or shapes differ) used to
reach the user as one traceback per worker, after the workers had started. Built on the meta
device, an 8B model costs the driver its module tree, not its 16 GB.

What the driver cannot judge stays the workers': a model whose constructor needs what only a
worker has (a GPU, a file on the workers' nodes) or computes with its weights while it is built
is not refused here; the driver says so in one line and the workers check it as before. Weights
in object storage are not fetched to the driver (the workers check their names and shapes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from distributed_runner.checkpoint.hf.directory import pretrained_source
from distributed_runner.checkpoint.hf.load import PretrainedWeights
from distributed_runner.core.errors import ArgumentError, ConfigError
from distributed_runner.core.storage import is_remote
from distributed_runner.engine.pipeline_step import refuse_own_train_step
from distributed_runner.engine.step_choice import trains_itself
from distributed_runner.model.build import build_empty_model, build_unmoved
from distributed_runner.model.empty_init import parameters_on_meta
from distributed_runner.model.sharding import check_shard_modules
from distributed_runner.parallel.pipeline import plan_stages

# what a constructor raising means a mistake in the config (not "cannot run on this machine")
CONFIG_MISTAKES = (ConfigError, ArgumentError, ValueError, TypeError, ImportError)


def check_model_on_meta(cfg: Mapping[str, Any], settings: Any, world: int) -> list[str]:
    """Build ``cfg['model']`` on the meta device and check it as a worker will on ``world``
    ranks (the pipeline's checks only where there are several: one process trains the model
    whole); the lines say what was checked. Raises the first refusal as its one line."""
    if not isinstance(cfg.get("model"), dict):
        return ["an object, not a config: the workers build and check it"]
    given, strict = settings.load_from
    source = pretrained_source(given)
    weights = PretrainedWeights(source, strict) if source and not is_remote(source) else None
    try:
        model = _build_on_meta(cfg["model"], weights)
    except ConfigError as e:
        if isinstance(e.__cause__, CONFIG_MISTAKES) or e.__cause__ is None:
            raise
        return [f"not built on the driver ({e.message}): the workers check it"]
    strategy = settings.strategy
    # shard_modules, activation checkpointing, the tensor-parallel plan (its matched modules)
    matched = check_shard_modules(model, strategy)
    count = sum(p.numel() for p in model.parameters())
    lines = [f"{type(model).__name__}, {count:,} parameters (built on the meta device)"]
    if matched:
        lines.append(f"tensor-parallel plan: {len(matched)} modules split over tp={strategy['tp']}")
    if strategy.get("pp", 1) > 1 and world > 1:  # the stages the workers will cut
        lines.append(_pipeline_line(model, strategy))
    if weights is not None:
        lines.append(f"load_from {source}: every name and shape matches the files' headers")
    elif source:
        lines.append(f"load_from {source}: in object storage, checked by the workers")
    return lines


def _pipeline_line(model: nn.Module, strategy: dict) -> str:
    """The stages the workers will cut (parallel/pipeline.py), checked as they will check them."""
    refuse_own_train_step(type(model).__name__, trains_itself(model))
    plan = plan_stages(model, strategy)
    if plan.traced:
        return "pipeline stages, cut by tracing the forward, start at: " + " | ".join(plan.names)
    return "pipeline stages: " + " | ".join(_span(plan.units(s)) for s in range(plan.stages))


def _span(units: tuple[str, ...]) -> str:
    return units[0] if len(units) == 1 else f"{units[0]} .. {units[-1]}"


def _build_on_meta(spec: dict, weights: PretrainedWeights | None) -> nn.Module:
    """The model with its parameters on the meta device, checked against ``weights`` (its
    files' headers) when it loads a model directory."""
    if weights is not None:
        return build_empty_model(spec, weights)
    with parameters_on_meta():
        return build_unmoved(spec)
