"""The model a Runner trains: built from its config, across several ranks wrapped in DDP or
sharded with FSDP2 (``strategy=``, :mod:`distributed_runner.model.sharding`), and with ``compile=``
compiled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol, cast

import torch
from torch import nn

from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import MODELS
from distributed_runner.core.signatures import accepts, check_arguments
from distributed_runner.model.activation_checkpointing import apply_activation_checkpointing
from distributed_runner.model.empty_init import materialize, parameters_on_meta
from distributed_runner.model.sharding import check_shard_modules, shard_model, shard_stage
from distributed_runner.parallel.pipeline import (
    PipelineParts,
    cut_by_tracing,
    split_for_pipeline,
)
from distributed_runner.parallel.traced_stages import adopt_tensors


def default_device() -> torch.device:
    """This rank's GPU (the local rank's) when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", dist.get_local_rank())
    return torch.device("cpu")


class WeightSource(Protocol):
    """Weights that come from files rather than from the model's own initialisation
    (``load_from`` a Hugging Face directory: checkpoint/hf/load.py). The model is then built
    with its parameters on the meta device; see :func:`setup_model` for when each is called."""

    def prepare(self, model: nn.Module) -> None:
        """Check the built (meta) model against the files; initialise what they lack."""

    def load(self, model: nn.Module) -> None:
        """Fill the model, sharded or not, once its storage exists (every rank calls it)."""


def build_model(spec: Any, device: torch.device) -> nn.Module:
    """``model=dict(type=...)`` (or a module) on ``device``. ``type`` is a registered name, an
    import path (``'transformers.GPT2LMHeadModel'``, ``'timm.create_model'``) or the class
    itself (core/registry.py); how the loops then call the model is engine/step_choice.py's
    business."""
    return build_unmoved(spec).to(device)


def build_unmoved(spec: Any) -> nn.Module:
    """The model as its config builds it, on whatever device that puts it (build_model moves
    it; an empty model keeps its parameters on the meta device)."""
    built = MODELS.build(spec, "model")
    if not isinstance(built, nn.Module):
        raise ConfigError(
            "model",
            f"built a {type(built).__name__}, not a torch nn.Module: "
            f"type= must name a model class or a factory returning one "
            f"(a config object goes in its arguments, e.g. config=dict("
            f"type=...))",
        )
    return built


def build_empty_model(spec: Any, weights: WeightSource) -> nn.Module:
    """The model with its parameters on the meta device (no memory, no initialisation) and
    whatever the files will not fill prepared by ``weights``."""
    with parameters_on_meta():
        model = build_unmoved(spec)  # buffers where they were made: materialize() moves them
    made_from_weights = [n for n, b in model.named_buffers() if b.device.type == "meta"]
    if made_from_weights:
        raise ConfigError(
            "load_from",
            f"the model computes its buffer {made_from_weights[0]} from its weights while it "
            f"is built, so it cannot be built without them: load_from a checkpoint instead",
        )
    weights.prepare(model)
    return model


def wrap_model(model: nn.Module, wrapper_cfg: dict, device: torch.device) -> nn.Module:
    """DDP when a process group with several ranks is running; the model itself otherwise.

    ``model_wrapper_cfg`` passes DDP arguments. ``broadcast_buffers`` defaults to False (as in
    MMEngine): buffers such as BN statistics stay per rank unless SyncBuffersHook averages
    them, instead of being silently overwritten by rank 0's before every forward.
    """
    if not dist.is_distributed():
        return model
    from torch.nn.parallel import DistributedDataParallel

    if "broadcast_buffers" not in wrapper_cfg:  # its newer name, where torch has it
        key = (
            "forward_sync_buffers"
            if accepts(DistributedDataParallel, "forward_sync_buffers")
            else "broadcast_buffers"
        )
        wrapper_cfg.setdefault(key, False)
    ids = [device.index] if device.type == "cuda" else None
    check_arguments(DistributedDataParallel, wrapper_cfg, "model_wrapper_cfg", supplied=["module"])
    return DistributedDataParallel(model, device_ids=ids, **wrapper_cfg)


COMPILE_HINT = "takes True, False or dict(mode=..., dynamic=..., backend=..., fullgraph=...)"


def check_compile(spec: Any) -> dict | None:
    """``compile=`` (MMEngine's key) as ``torch.compile``'s keyword arguments; None when off."""
    if spec is None or spec is False:
        return None
    if spec is True:
        return {}
    if not isinstance(spec, dict):
        raise ConfigError("compile", f"got {spec!r:.60}; {COMPILE_HINT}")
    check_arguments(torch.compile, spec, "compile", supplied=["model"])
    return dict(spec)


def compile_model(wrapped: nn.Module, args: dict | None) -> nn.Module:
    """What the loops call, compiled with ``torch.compile`` when ``compile=`` asks for it.

    Only the callable the loops use (``runner.wrapped_model``) is compiled; ``runner.model``
    stays the user's own module holding the same parameters. So checkpoints keep the keys an
    uncompiled model has (a compiled run's checkpoint loads into an eager one and back), and EMA,
    hooks and ``get_ori_model`` see the module they would see without compile. With DDP the
    wrapper itself is compiled, as PyTorch recommends (graph breaks at gradient buckets).
    """
    if args is None:  # check_compile's result: None when compile= is off
        return wrapped
    # torch.compile of a module is an OptimizedModule (a Module); typed as any callable's
    return cast(nn.Module, torch.compile(wrapped, **args))


def _compiled_inner(model: Any) -> Any:
    """The module inside a ``torch.compile`` wrapper (``OptimizedModule``), else None."""
    return model._orig_mod if type(model).__name__ == "OptimizedModule" else None


class BuiltModel(NamedTuple):
    """:func:`setup_model`'s result: the user's model (under pipeline parallelism, this rank's
    stages of it), what the loops call, and this rank's part of the pipeline (None without)."""

    model: nn.Module
    wrapped: nn.Module
    pipeline: PipelineParts | None


def setup_model(
    spec: Any,
    wrapper_cfg: dict | None,
    compile_args: dict | None,
    device: torch.device,
    strategy: dict,
    weights: WeightSource | None = None,
) -> BuiltModel:
    """The user's model on ``device`` and what the loops call (DDP-wrapped or sharded in place,
    then compiled). ``strategy`` is :func:`~.sharding.parse_strategy`'s result and
    ``compile_args`` :func:`check_compile`'s (the config's sections, parsed once). Under
    pipeline parallelism the model keeps this rank's stages only (parallel/pipeline.py).

    Activation checkpointing is set up first, on the user's own modules (before DDP or
    ``fully_shard`` sees them and before compile traces them): it replaces only their
    ``forward``, so the keys of ``state_dict()`` and the class names FSDP matches stay.

    With ``weights`` the model is built empty, sharded while empty, and only then given storage
    (this rank's shards) and filled: no rank ever holds the whole model under FSDP."""
    model = build_model(spec, device) if weights is None else build_empty_model(spec, weights)
    if strategy["type"] == "fsdp" and wrapper_cfg:
        raise ConfigError(
            "model_wrapper_cfg",
            "holds DDP arguments, but strategy is FSDP: put FSDP options in strategy=dict(...)",
        )
    matched = check_shard_modules(model, strategy)  # the tensor-parallel plan, matched once
    pipeline = _cut_into_stages(model, strategy, device, matched, weights is not None)
    recomputed = strategy.get("activation_checkpointing", [])
    for part, classes in _running_modules(model, pipeline):
        apply_activation_checkpointing(part, recomputed, classes)
    sharded = strategy["type"] == "fsdp" and dist.is_distributed() and strategy.get("pp", 1) == 1
    if sharded:
        shard_model(model, strategy, device, matched)
    elif pipeline is not None and pipeline.data_mesh is not None:  # a stage's ranks shard it
        for stage in pipeline.stages:
            shard_stage(stage, strategy, pipeline.data_mesh, pipeline.classes)
        if pipeline.plan.traced:  # FSDP gave the traced stages new parameters: the model's too
            adopt_tensors(model, pipeline.stages)
    if weights is not None:
        if pipeline is None or not pipeline.plan.traced:  # a traced one has storage already
            materialize(model, device)
        weights.load(model)
    wrapped = (
        model if strategy["type"] == "fsdp" else wrap_model(model, dict(wrapper_cfg or {}), device)
    )
    if pipeline is not None:  # the schedule calls the stages: each is compiled in place
        if compile_args is not None:
            for stage in pipeline.stages:
                stage.compile(**compile_args)
        return BuiltModel(model, wrapped, pipeline)
    return BuiltModel(model, compile_model(wrapped, compile_args), pipeline)


def _cut_into_stages(
    model: nn.Module, strategy: dict, device: torch.device, matched: dict, empty: bool
) -> PipelineParts | None:
    """This rank's part of the pipeline (``model`` keeps its stages only), or None without
    one. A model built ``empty`` and cut by tracing gets storage first: a trace on the meta
    device keeps that device for the tensors its forward makes."""
    if strategy.get("pp", 1) == 1 or not dist.is_distributed():
        return None
    if empty and cut_by_tracing(model, strategy):
        materialize(model, device)
    return split_for_pipeline(model, strategy, device, matched)


def _running_modules(
    model: nn.Module, pipeline: PipelineParts | None
) -> list[tuple[nn.Module, dict[str, str]]]:
    """The modules whose forward runs, with their classes by name where their types are not
    them: the model itself, or a traced cut's stages (parallel/traced_stages.py)."""
    if pipeline is not None and pipeline.plan.traced:
        return [(stage, pipeline.classes) for stage in pipeline.stages]
    return [(model, {})]


def is_model_wrapper(model: Any) -> bool:
    """Whether ``model`` wraps the user's model in ``.module`` (DDP, DataParallel, FSDP1, a
    TTA wrapper): MMEngine's ``mmengine.model.is_model_wrapper``."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    wrappers: tuple[type, ...] = (DistributedDataParallel, DataParallel)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        wrappers += (FullyShardedDataParallel,)
    except ImportError:  # pragma: no cover - torch built without distributed
        pass
    return isinstance(model, wrappers) or bool(getattr(model, "is_model_wrapper", False))


def wrapper_layers(model: nn.Module) -> Iterator[nn.Module]:
    """``model``, then each module it wraps (``torch.compile``'s, DDP, FSDP1, a TTA wrapper...),
    ending with the user's model."""
    while True:
        yield model
        inner = _compiled_inner(model)
        if inner is None and is_model_wrapper(model):
            inner = model.module
        if inner is None:
            return
        model = inner


def get_ori_model(model: nn.Module) -> nn.Module:
    """The user's model inside any wrappers, compiled ones too (what downstream hooks call
    ``get_ori_model``)."""
    *_, innermost = wrapper_layers(model)
    return innermost
