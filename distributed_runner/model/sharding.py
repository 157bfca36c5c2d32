"""``strategy=``: how the model is spread over the ranks — DDP (every rank holds all of it, the
default) or FSDP2 (``torch.distributed.fsdp.fully_shard``: each rank holds a shard of every
parameter, gradient and optimizer state, and gathers a module's parameters only while it runs).

    strategy = dict(type='fsdp',
                    shard_modules=['Block'],            # module classes sharded one by one
                    mixed_precision=dict(param_dtype='bfloat16', reduce_dtype='float32'),
                    reshard_after_forward=True,         # free gathered parameters after forward
                    cpu_offload=False,                  # keep shards in host memory
                    checkpoint='sharded',               # or 'full' (one file, gathered)
                    activation_checkpointing=['Block'],  # recomputed in backward
                    tp=1,                               # tensor-parallel ranks per replica
                    tp_plan=None,                       # the model's own plan, or a dict
                    dp_replicate=1,                     # HSDP: replicas of the sharded model
                    pp=1, pp_schedule='1F1B',           # pipeline stages (parallel/pipeline.py)
                    pp_microbatches=None, pp_split=None)

``tp=T`` splits the layers of the model's tensor-parallel plan over ``T`` consecutive ranks
before FSDP shards over the rest, and ``dp_replicate=R`` replicates the shards ``R`` times
(HSDP): the mesh is ``(R, W/(R*T), T)`` (:mod:`distributed_runner.parallel`).

DDP takes one option here, ``strategy=dict(type='ddp', activation_checkpointing=[...])`` (its
own arguments are ``model_wrapper_cfg``); activation checkpointing is
:mod:`.activation_checkpointing`.

Why per-module sharding matters: ``fully_shard`` gathers one unit's parameters at a time, so peak
memory is one unit's full parameters plus every unit's shard. Without ``shard_modules`` only the
root is a unit and the whole model is gathered for the forward (correct, but no memory saved).

``checkpoint='sharded'`` has every rank write its own shards
(:mod:`distributed_runner.checkpoint.sharded`); ``'full'`` gathers full, unsharded tensors to rank
0 under the same keys as an unsharded model (``torch.distributed.checkpoint.state_dict``, a
collective every rank joins) into one file. Both
load into DDP, into one process, or into FSDP on another world size. With one process
(no process group) there is nothing to shard and the model trains whole.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import nn

from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError, did_you_mean
from distributed_runner.model.activation_checkpointing import check_module_classes
from distributed_runner.parallel.mesh import MeshShape, build_mesh, data_parallel_mesh
from distributed_runner.parallel.pipeline import PIPELINE_DEFAULTS, parse_pipeline
from distributed_runner.parallel.tensor_parallel import (
    apply_tensor_parallel,
    check_divisible,
    match_plan,
    resolve_plan,
)
from distributed_runner.parallel.tensors import (
    full_tensor,
    like_param,
    local_tensor,
    shard_like,
)

STRATEGIES = ("ddp", "fsdp")
FSDP_DEFAULTS: dict[str, Any] = {
    "shard_modules": [],
    "mixed_precision": None,
    "reshard_after_forward": True,
    "cpu_offload": False,
    "checkpoint": "sharded",
    "activation_checkpointing": [],
    "tp": 1,
    "tp_plan": None,
    "dp_replicate": 1,
    **PIPELINE_DEFAULTS,
}
DDP_OPTIONS = ("activation_checkpointing",)
MESH_OPTIONS = ("tp", "tp_plan", "dp_replicate", *PIPELINE_DEFAULTS)
DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


def parse_strategy(spec: Any) -> dict:
    """``None``/``'ddp'``/``'fsdp'``/``dict(type=..., ...)`` as a full dict; one-line errors."""
    spec = _strategy_as_dict(spec)
    kind = _strategy_kind(spec)
    args = {k: v for k, v in spec.items() if k != "type"}
    if kind == "ddp":
        return _parse_ddp(args)
    return _parse_fsdp(args)


def _strategy_as_dict(spec: Any) -> dict:
    """``None`` and a bare name as ``dict(type=...)``, so the rest reads one shape."""
    if spec is None:
        spec = "ddp"
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict):
        raise ConfigError(
            "strategy",
            f"got {spec!r:.60}; takes 'ddp', 'fsdp' or dict(type='fsdp', shard_modules=[...], ...)",
        )
    return spec


def _strategy_kind(spec: dict) -> str:
    """``strategy.type`` lower-cased and checked against STRATEGIES (default 'ddp')."""
    kind = str(spec.get("type", "ddp")).lower()
    if kind not in STRATEGIES:
        raise ConfigError(
            "strategy.type",
            f"unknown strategy {kind!r}{did_you_mean(kind, STRATEGIES)}; takes 'ddp' or 'fsdp'",
        )
    return kind


def _parse_ddp(args: dict) -> dict:
    """DDP's one option here; its own arguments live in model_wrapper_cfg, so others are errors."""
    for key in args:
        if key in MESH_OPTIONS:
            raise ConfigError(
                f"strategy.{key}",
                f"{key} needs FSDP: use strategy=dict(type='fsdp', {key}=...) (DDP keeps "
                f"a whole model on every rank)",
            )
        if key not in DDP_OPTIONS:
            raise ConfigError(
                f"strategy.{key}",
                f"DDP has no option {key!r}"
                f"{did_you_mean(key, DDP_OPTIONS)} here: it "
                f"takes activation_checkpointing, and its "
                f"own arguments from "
                f"model_wrapper_cfg=dict(...)",
            )
    return {
        "type": "ddp",
        "activation_checkpointing": _class_names(
            args.get("activation_checkpointing", []), "activation_checkpointing"
        ),
    }


def _parse_fsdp(args: dict) -> dict:
    """FSDP's options over FSDP_DEFAULTS, each checked: a typo must not fall back to a default.

    Args:
        shard_modules (list[str]): module class names each sharded as one unit (e.g. a
            transformer block); empty shards the model as one unit.
        mixed_precision (dict | None): ``dict(param_dtype=..., reduce_dtype=...)`` for FSDP2's
            mixed precision; None trains in the parameters' dtype.
        reshard_after_forward (bool): free gathered weights after each unit's forward (less
            memory, one more all-gather in backward).
        cpu_offload (bool): keep sharded parameters and optimizer state in host memory.
        checkpoint (str): 'sharded' (each rank writes its shards) or 'full' (one file on rank 0).
        activation_checkpointing (list[str]): module class names whose activations are
            recomputed in backward instead of kept.
        tp (int): ranks that split each layer of the tensor-parallel plan (1: none).
        tp_plan (dict | None): module-name patterns to styles; None takes the model's own.
        dp_replicate (int): replicas of the sharded model (HSDP); FSDP shards within each.
        pp (int): pipeline stages, one a rank (parallel/pipeline.py); 1: none.
        pp_schedule (str): torch's schedule: 'GPipe', '1F1B', 'Interleaved1F1B', 'LoopedBFS',
            'InterleavedZeroBubble' (these three: pp_stages_per_rank stages a rank, in a loop),
            'ZBVZeroBubble' or 'DualPipeV' (2 stages a rank, in a V).
        pp_microbatches (int | None): micro-batches a batch is cut into (>= the stages);
            None: as many as stages.
        pp_split (list[str] | None): the units stages start at (['model.layers.8']); None:
            the model's plan cut evenly. A causal LM without a plan is cut by tracing its
            forward before these modules (parallel/traced_stages.py).
        pp_stages_per_rank (int): stages a rank holds under a looped schedule.
    """
    for key in args:
        if key not in FSDP_DEFAULTS:
            raise ConfigError(
                f"strategy.{key}",
                f"FSDP has no option {key!r}"
                f"{did_you_mean(key, FSDP_DEFAULTS)}; it takes: "
                f"{', '.join(FSDP_DEFAULTS)}",
            )
    out = dict(type="fsdp", **{**FSDP_DEFAULTS, **args})
    for key in ("shard_modules", "activation_checkpointing"):
        out[key] = _class_names(out[key], key)
    if out["checkpoint"] not in ("full", "sharded"):
        raise ConfigError(
            "strategy.checkpoint",
            f"got {out['checkpoint']!r:.40}; takes "
            f"'sharded' (each rank writes its shards) or "
            f"'full' (one file gathered on rank 0)",
        )
    for flag in ("reshard_after_forward", "cpu_offload"):
        if not isinstance(out[flag], bool):
            raise ConfigError(f"strategy.{flag}", f"got {out[flag]!r:.60}; takes True or False")
    _check_mixed_precision(out["mixed_precision"])
    for key in ("tp", "dp_replicate", "pp_stages_per_rank"):
        if isinstance(out[key], bool) or not isinstance(out[key], int) or out[key] < 1:
            raise ConfigError(f"strategy.{key}", f"got {out[key]!r:.40}; takes an integer >= 1")
    parse_pipeline(out)
    return out


def _check_mixed_precision(mixed: Any) -> None:
    """``strategy.mixed_precision``: None or a dict of known keys to DTYPES names (or None)."""
    if mixed is not None:
        if not isinstance(mixed, dict):
            raise ConfigError(
                "strategy.mixed_precision",
                "takes dict(param_dtype='bfloat16', reduce_dtype='float32') or None",
            )
        for key, value in mixed.items():
            if key not in ("param_dtype", "reduce_dtype", "output_dtype"):
                raise ConfigError(
                    f"strategy.mixed_precision.{key}",
                    "takes param_dtype, reduce_dtype, output_dtype",
                )
            if value is not None and value not in DTYPES:
                raise ConfigError(
                    f"strategy.mixed_precision.{key}",
                    f"got {value!r:.40}; takes one of {', '.join(DTYPES)}",
                )


def _class_names(names: Any, key: str) -> list[str]:
    """``strategy.<key>`` (a class name or a list of them) as a list; one-line error else."""
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            f"strategy.{key}",
            f"got {names!r:.60}; takes a list of module class names, e.g. ['TransformerBlock']",
        )
    return list(names)


def check_shard_modules(model: nn.Module, strategy: dict) -> dict[str, str]:
    """Every ``shard_modules`` (and ``activation_checkpointing``) name is a class in the model,
    and a tensor-parallel plan fits it (checked with one process too: a misspelled name must not
    quietly leave the model unsharded, or its activations all kept, on the cluster); returns the
    plan's modules matched (module name -> style), empty without tensor parallelism."""
    for key in ("shard_modules", "activation_checkpointing"):
        check_module_classes(model, strategy.get(key, []), f"strategy.{key}")
    tp = strategy.get("tp", 1)
    if strategy.get("tp_plan") is not None and tp == 1:
        raise ConfigError(
            "strategy.tp_plan", "is set but tp=1: add tp=N (the ranks that split each layer)"
        )
    if tp == 1:
        return {}
    matched = match_plan(model, resolve_plan(model, strategy["tp_plan"]))
    check_divisible(model, matched, tp)
    return matched


def mesh_shape(strategy: dict) -> MeshShape | None:
    """The mesh FSDP (and TP) will use for this world; None with one process or DDP, where the
    model is not split. One line when ``tp``/``dp_replicate`` do not divide the world."""
    if strategy["type"] != "fsdp" or not dist.is_distributed() or strategy["pp"] > 1:
        return None  # one process, DDP, or the pipeline's stages (parallel/pipeline.py)
    return MeshShape.for_world(dist.get_world_size(), strategy["tp"], strategy["dp_replicate"])


def shard_model(
    model: nn.Module, strategy: dict, device: torch.device, matched: dict[str, str]
) -> nn.Module:
    """Split the plan's layers over ``tp`` (when asked; ``matched``: the plan's modules as
    :func:`check_shard_modules` matched them), then ``fully_shard`` each module of a
    ``shard_modules`` class (innermost first) and the root over the data-parallel mesh.

    The model is sharded in place: the object stays the user's module (its class becomes an
    ``FSDP<Name>`` subclass), so ``runner.model`` is still what hooks see.
    """
    from torch.distributed.device_mesh import init_device_mesh

    shape = mesh_shape(strategy)
    assert shape is not None, "shard_model runs with several ranks"
    if shape.tp == 1 and shape.dp_replicate == 1:  # plain FSDP: one dimension
        data_mesh = init_device_mesh(device.type, (shape.world,))
    else:
        mesh = build_mesh(shape, device.type)
        data_mesh = data_parallel_mesh(mesh, shape)
        if shape.tp > 1:
            apply_tensor_parallel(model, matched, mesh["tp"])
    _fully_shard_units(model, strategy, data_mesh)
    return model


def shard_stage(
    stage: nn.Module, strategy: dict, data_mesh: Any, classes: dict[str, str] | None = None
) -> None:
    """A pipeline stage's module (parallel/pipeline.py) sharded over its ranks: each module of a
    ``shard_modules`` class, then the stage as FSDP's root (the schedule calls it, and tells
    FSDP which backward of a step is the last). ``classes``: each module's class by name, for
    a traced stage, whose modules stand in for the model's."""
    _fully_shard_units(stage, strategy, data_mesh, classes or {})


def _fully_shard_units(
    root: nn.Module, strategy: dict, data_mesh: Any, classes: dict[str, str] | None = None
) -> None:
    """``fully_shard`` each ``shard_modules`` module of ``root`` (innermost first; its class
    is ``classes``' entry for its name, else its type's), then ``root``, over ``data_mesh``
    with the strategy's FSDP options."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    options: dict[str, Any] = {
        "mesh": data_mesh,
        "reshard_after_forward": strategy["reshard_after_forward"],
    }
    if strategy["mixed_precision"]:
        policy: dict[str, Any] = {
            k: DTYPES[v] if v else None for k, v in strategy["mixed_precision"].items()
        }
        options["mp_policy"] = MixedPrecisionPolicy(**policy)
    if strategy["cpu_offload"]:
        options["offload_policy"] = CPUOffloadPolicy()
    wanted, classes = set(strategy["shard_modules"]), classes or {}
    for name, module in reversed(list(root.named_modules())[1:]):  # children before parents
        if classes.get(name, type(module).__name__) in wanted:
            fully_shard(module, **options)
    fully_shard(root, **options)


def is_sharded(model: Any) -> bool:
    """Whether ``model`` is an FSDP2 module (cheap: FSDP is only imported once used)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def _full_options(strict: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True, strict=strict)


def full_model_state(model: nn.Module) -> dict:
    """The unsharded weights on rank 0 (other ranks get an empty dict); every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options())


def load_full_model_state(model: nn.Module, state: dict, strict: bool = True) -> None:
    """Shard full weights (read by every rank) into the model's shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(
        model, state, options=StateDictOptions(full_state_dict=True, strict=strict)
    )


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer state keyed by parameter name, unsharded, on rank 0."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=_full_options())


def load_full_optimizer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(
        model, optimizer, state, options=StateDictOptions(full_state_dict=True)
    )


def local_training_state(
    params: list[tuple[str, torch.Tensor]], optimizer: torch.optim.Optimizer | None
) -> dict:
    """This rank's slices of the weights (``params``: the sharded parameters by name, taken
    before training swaps in FSDP's gathered ones) and of the optimizer's state, as plain
    tensors, without a collective: what the same rank of a group with the same mesh takes
    over (a fault-tolerant replica group healing from a peer, fault_tolerance/)."""
    weights = {name: local_tensor(p).detach().clone() for name, p in params}
    if optimizer is None:
        return {"model": weights}
    state = optimizer.state_dict()
    slices = {
        index: {k: local_tensor(v).clone() if torch.is_tensor(v) else v for k, v in per.items()}
        for index, per in state["state"].items()
    }
    return {"model": weights, "optimizer": {**state, "state": slices}}


def load_local_training_state(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, state: dict
) -> None:
    """Put :func:`local_training_state`'s slices (from the same rank of a group with the same
    mesh) into this rank's shards and optimizer; no collective."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, local in state["model"].items():
            local_tensor(params[name]).copy_(local)
    if optimizer is None or "optimizer" not in state:
        return
    saved = state["optimizer"]
    order = [p for group in optimizer.param_groups for p in group["params"]]

    def placed(value: Any, param: torch.Tensor) -> Any:  # a slice shaped as its parameter's
        shaped = torch.is_tensor(value) and value.shape == local_tensor(param).shape
        return like_param(value, param) if shaped and value.dim() else value

    slices = {
        index: {k: placed(v, order[index]) for k, v in per.items()}
        for index, per in saved["state"].items()
    }
    optimizer.load_state_dict({**saved, "state": slices})


class LoadResult(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


class ShardedCopy:
    """A frozen copy of a sharded model's parameters and buffers, for what averages weights
    (EMA): FSDP modules cannot be deep-copied. Its tensors keep the model's shards, so averaging
    is per shard; ``state_dict`` gathers full tensors under the model's own keys (a collective,
    which checkpoints run on every rank) and ``load_state_dict`` cuts them back into shards.
    It answers the calls an averaged model makes on its copy; it runs no forward."""

    def __init__(self, model: nn.Module) -> None:
        self._params = {n: p.detach().clone() for n, p in model.named_parameters()}
        self._buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        # what the model itself saves: not its non-persistent buffers (a Llama's rotary
        # inv_freq), which a whole model's averaged copy would not expect back
        self._saved = set(model.state_dict())

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._params.items())

    def named_buffers(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self._buffers.items())

    def requires_grad_(self, requires_grad: bool = True) -> ShardedCopy:
        return self  # detached copies: never part of a graph

    def state_dict(self) -> dict[str, torch.Tensor]:
        own = {**self._params, **self._buffers}
        return {n: full_tensor(t) for n, t in own.items() if n in self._saved}

    @torch.no_grad()
    def load_state_dict(self, state: dict, strict: bool = True) -> LoadResult:
        own = {n: t for n, t in {**self._params, **self._buffers}.items() if n in self._saved}
        state = {k: v for k, v in state.items() if k in own or k not in self._buffers}
        result = LoadResult([k for k in own if k not in state], [k for k in state if k not in own])
        if strict and (result.missing_keys or result.unexpected_keys):
            raise RuntimeError(
                f"missing keys {result.missing_keys[:3]}, unexpected keys "
                f"{result.unexpected_keys[:3]}"
            )
        for name, tensor in own.items():
            if name in state:
                tensor.copy_(shard_like(state[name], tensor))
        return result
