"""Pipeline parallelism: the model cut into stages along its own pipeline plan.

``strategy=dict(type='fsdp', pp=P, pp_schedule='1F1B', pp_microbatches=M, pp_split=None)`` runs
the model as ``P`` stages on ``P`` ranks (``v x P`` for the looped schedules, ``v`` a rank;
2 a rank in a V: ZBVZeroBubble, DualPipeV), each batch cut into ``M`` micro-batches that flow
through the stages as torch's schedule orders them (``torch.distributed.pipelining``: GPipe,
1F1B, Interleaved1F1B ...).

Where the cuts go: a Hugging Face decoder declares its pipeline plan
(``config.base_model_pp_plan``: Llama's is ``embed_tokens -> layers -> norm``, then the head).
The units are the embedding, each decoder layer and the head (the final norm with it), weighing
one layer each, split evenly over the stages unless ``pp_split`` names where stages start
(``['model.layers.8', ...]``). A causal LM without such a plan (GPT-2 ...) is cut before the
modules ``pp_split`` names by tracing its forward (:mod:`.traced_stages`): its stages are
graphs over the model's own modules, so what follows holds for them too.

Each rank keeps only its stages' modules **in the model itself** (:func:`prune_to_stages`): the
others are dropped, and the decoder's layers become a ModuleDict keyed by their index, so every
parameter keeps its full name (``model.layers.5.self_attn.q_proj.weight``). A checkpoint is the
stages' weights gathered under those names (:mod:`distributed_runner.checkpoint.parts`): the
one-process checkpoint, which resumes at any ``pp`` or in one process. A :class:`DecoderStage`
is the forward of a range of units, over the same module objects; the schedule calls it.

The ranks form a ``(pp, dp_replicate, dp_shard, tp)`` mesh, stages outermost and TP innermost
(:func:`split_for_pipeline`): a stage's modules of the tensor-parallel plan are split over
``tp`` ranks, and the stage is sharded by FSDP over its ``world / (pp x tp)`` data-parallel
ranks (replicated ``dp_replicate`` times, sharded within: HSDP).

What is refused, in one line each before anything trains: ``pp`` not dividing the world or
giving more stages than units, a model with no plan this module can run and no ``pp_split``,
fewer micro-batches than stages, an unknown schedule.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from distributed_runner.core.errors import ConfigError, did_you_mean
from distributed_runner.parallel.tensors import local_tensor, shard_like

# schedule name -> (torch's class, how a rank's stages are placed: one stage a rank ('single'),
# stages r, r + P, ... ('loop'), or stages r and 2P - 1 - r ('v': the last stage on rank 0))
SCHEDULES: dict[str, tuple[str, str]] = {
    "GPipe": ("ScheduleGPipe", "single"),
    "1F1B": ("Schedule1F1B", "single"),
    "Interleaved1F1B": ("ScheduleInterleaved1F1B", "loop"),
    "LoopedBFS": ("ScheduleLoopedBFS", "loop"),
    "InterleavedZeroBubble": ("ScheduleInterleavedZeroBubble", "loop"),
    "ZBVZeroBubble": ("ScheduleZBVZeroBubble", "v"),
    "DualPipeV": ("ScheduleDualPipeV", "v"),
}
PIPELINE_DEFAULTS: dict[str, Any] = {
    "pp": 1,
    "pp_schedule": "1F1B",
    "pp_microbatches": None,  # None: as many as stages
    "pp_split": None,
    "pp_stages_per_rank": 2,  # v, for the looped schedules
}


@dataclass(frozen=True)
class StagePlan:
    """How the units (``names``: the embedding, each layer, the head) are cut: stage ``i``
    holds ``names[starts[i]:starts[i + 1]]``; rank ``r`` holds ``stages_of(r)``."""

    names: tuple[str, ...]
    starts: tuple[int, ...]
    pp: int
    style: str  # SCHEDULES' placement: 'single', 'loop' or 'v'
    # a cut by tracing (parallel/traced_stages.py), where a unit is a stage's start: the whole
    # model's state names, in its order
    order: tuple[str, ...] = ()

    @property
    def traced(self) -> bool:
        """Cut by tracing the forward (a unit is a stage's start), not along a plan."""
        return bool(self.order)

    @property
    def looped(self) -> bool:
        """Several stages a rank (torch's multi-stage schedules)."""
        return self.style != "single"

    @property
    def stages(self) -> int:
        return len(self.starts)

    def units(self, stage: int) -> tuple[str, ...]:
        end = self.starts[stage + 1] if stage + 1 < self.stages else len(self.names)
        return self.names[self.starts[stage] : end]

    def stages_of(self, rank: int) -> list[int]:
        """Rank ``r``'s stages: ``r, r + P, r + 2P ...`` (one or a loop), or ``r`` and
        ``2P - 1 - r`` (a V)."""
        if self.style == "v":
            return [rank, 2 * self.pp - 1 - rank]
        return list(range(rank, self.stages, self.pp))

    def rank_of(self, stage: int) -> int:
        """The rank in the pipeline that holds ``stage``."""
        return next(r for r in range(self.pp) if stage in self.stages_of(r))

    def position(self, name: str) -> int:
        """Where a state name sits in the whole model's order: its place in ``order``, else its
        unit's (the final norm goes with the head, as in the model's own order: ``model.norm``
        before ``lm_head``)."""
        if self.order:
            return self.order.index(name) if name in self.order else len(self.order)
        for i, unit in enumerate(self.names):
            if name.startswith(f"{unit}."):
                return i
        return len(self.names) - 1 if ".norm." in f".{name}" else len(self.names)


def parse_pipeline(out: dict) -> None:
    """``strategy``'s pipeline options, checked in place (one line naming the key)."""
    pp, name = out["pp"], out["pp_schedule"]
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
        raise ConfigError("strategy.pp", f"got {pp!r:.40}; takes an integer >= 1 (stages)")
    if name not in SCHEDULES:
        raise ConfigError(
            "strategy.pp_schedule",
            f"unknown schedule {name!r}{did_you_mean(str(name), SCHEDULES)}; takes "
            f"{', '.join(SCHEDULES)}",
        )
    v = stages_per_rank(out)
    m = out["pp_microbatches"]
    if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < pp * v):
        raise ConfigError(
            "strategy.pp_microbatches",
            f"got {m!r:.40}; takes an integer >= the {pp * v} stages (fewer leaves a stage "
            f"idle in every step)",
        )
    split = out["pp_split"]
    if split is not None and (
        not isinstance(split, (list, tuple)) or not all(isinstance(s, str) for s in split)
    ):
        raise ConfigError(
            "strategy.pp_split",
            "takes a list of module names where stages start, e.g. ['model.layers.8']",
        )


def stages_per_rank(strategy: dict) -> int:
    """``v``: 1, ``pp_stages_per_rank`` for a looped schedule, 2 for a V."""
    style = SCHEDULES[strategy["pp_schedule"]][1]
    return {"single": 1, "v": 2}.get(style, int(strategy["pp_stages_per_rank"]))


def microbatches(strategy: dict) -> int:
    m = strategy["pp_microbatches"]
    return int(m) if m is not None else strategy["pp"] * stages_per_rank(strategy)


def check_layout(strategy: dict, world: int, key: str = "strategy.pp") -> None:
    """``pp x dp_replicate x tp`` divides the world; a stage's ranks split it with TP and
    shard it with FSDP (replicated ``dp_replicate`` times: HSDP)."""
    pp, tp, replicate = strategy["pp"], strategy.get("tp", 1), strategy.get("dp_replicate", 1)
    if world % (pp * tp * replicate):
        sizes = " x ".join(
            f"{k}={v}" for k, v in (("pp", pp), ("dp_replicate", replicate), ("tp", tp)) if v > 1
        )
        raise ConfigError(key, f"{sizes} does not divide the world size {world}")


# -- the model's plan ---------------------------------------------------------------------------
def _decoder(model: Any) -> tuple[str, Any] | None:
    """``(prefix, base model)`` of a Hugging Face decoder whose plan this module runs: its base
    model has ``embed_tokens``, a ``layers`` ModuleList, ``norm`` and ``rotary_emb``, and the
    model a ``lm_head`` (Llama, Mistral, Qwen2/3 ...)."""
    plan = getattr(getattr(model, "config", None), "base_model_pp_plan", None)
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else None
    if not plan or base is None or not hasattr(model, "lm_head"):
        return None
    parts = ("embed_tokens", "layers", "norm", "rotary_emb")
    if list(plan) != ["embed_tokens", "layers", "norm"] or not all(hasattr(base, p) for p in parts):
        return None
    return prefix, base


def cut_by_tracing(model: Any, strategy: dict) -> bool:
    """Whether ``model``'s stages are cut by tracing its forward (parallel/traced_stages.py):
    it has no plan this module runs, and ``pp_split`` says where to cut."""
    return (
        strategy.get("pp", 1) > 1 and strategy.get("pp_split") is not None and not _decoder(model)
    )


def plan_stages(model: Any, strategy: dict) -> StagePlan:
    """The stages of ``model`` under ``strategy`` (one line when it cannot be cut so)."""
    found = _decoder(model)
    if found is None and strategy["pp_split"] is not None:
        return _traced_plan(model, strategy)
    if found is None:
        raise ConfigError(
            "strategy.pp",
            f"{type(model).__name__} has no pipeline plan drun can run (a Hugging Face "
            f"decoder's config.base_model_pp_plan: embed_tokens -> layers -> norm, and lm_head): "
            f"name where stages start in strategy.pp_split to cut it by tracing",
        )
    prefix, base = found
    if getattr(model.config, "tie_word_embeddings", False):
        raise ConfigError(
            "strategy.pp",
            "tie_word_embeddings=True ties the head to the embedding, which sit on the first "
            "and the last stage: set it False in the model's config",
        )
    layers = len(base.layers)
    layer_names = (f"{prefix}.layers.{i}" for i in range(layers))
    names = (f"{prefix}.embed_tokens", *layer_names, "lm_head")
    v = stages_per_rank(strategy)
    stages = strategy["pp"] * v
    split = strategy["pp_split"]
    starts = _starts_of(names, split) if split is not None else _even(len(names), stages)
    if len(starts) != stages:
        raise ConfigError(
            "strategy.pp_split" if split is not None else "strategy.pp",
            f"{len(starts)} stage(s) from {len(names)} units (embedding, {layers} layers, head), "
            f"but pp={strategy['pp']} x {v} stage(s) a rank needs {stages}",
        )
    return StagePlan(names, tuple(starts), strategy["pp"], SCHEDULES[strategy["pp_schedule"]][1])


def _traced_plan(model: Any, strategy: dict) -> StagePlan:
    """A model without a plan, cut before each module of ``pp_split`` by tracing it
    (parallel/traced_stages.py): stage ``i`` starts at unit ``i`` (the first at the input)."""
    from distributed_runner.parallel.traced_stages import check_traceable

    check_traceable(model, strategy)
    split, v = tuple(strategy["pp_split"]), stages_per_rank(strategy)
    if len(split) + 1 != strategy["pp"] * v:
        raise ConfigError(
            "strategy.pp_split",
            f"{len(split) + 1} stage(s) from {len(split)} cut(s), but pp={strategy['pp']} x {v} "
            f"stage(s) a rank needs {strategy['pp'] * v}",
        )
    return StagePlan(
        ("input_ids", *split),
        tuple(range(len(split) + 1)),
        strategy["pp"],
        SCHEDULES[strategy["pp_schedule"]][1],
        order=tuple(model.state_dict()),
    )


def _even(units: int, stages: int) -> list[int]:
    if units < stages:
        raise ConfigError(
            "strategy.pp",
            f"{stages} stages from {units} units (the embedding, the layers, the head): "
            f"lower pp or pp_stages_per_rank",
        )
    return [i * units // stages for i in range(stages)]


def _starts_of(names: tuple[str, ...], split: list[str]) -> list[int]:
    starts = [0]
    for name in split:
        if name not in names:
            raise ConfigError(
                "strategy.pp_split",
                f"{name!r} is not a unit of the plan{did_you_mean(name, names)}; stages start "
                f"at {names[1]!r} ... {names[-1]!r}",
            )
        if names.index(name) <= starts[-1]:
            raise ConfigError("strategy.pp_split", f"{name!r} is out of order or repeated")
        starts.append(names.index(name))
    return starts


# -- this rank's part ---------------------------------------------------------------------------
def prune_to_stages(model: Any, plan: StagePlan, rank: int) -> None:
    """Drop from ``model`` every unit no stage of ``rank`` holds; the decoder's layers become a
    ModuleDict keyed by index, so what stays keeps its full name."""
    prefix, base = _decoder(model)  # type: ignore[misc]  # plan_stages found it: not None
    held = {u for stage in plan.stages_of(rank) for u in plan.units(stage)}
    layers = base.layers
    base.layers = nn.ModuleDict(
        {str(i): layer for i, layer in enumerate(layers) if f"{prefix}.layers.{i}" in held}
    )
    if f"{prefix}.embed_tokens" not in held:
        base.embed_tokens = None
    if "lm_head" not in held:
        base.norm = None
        model.lm_head = None


@dataclass
class PipelineParts:
    """This rank's part of the pipeline: the plan, its stage modules (in stage order), the
    pipeline's process group, this rank's place in it, and its stage's data-parallel mesh
    (None: one rank a stage)."""

    plan: StagePlan
    stages: list[nn.Module]
    group: Any
    pp_rank: int
    data_mesh: Any
    built: dict = field(default_factory=dict)  # batch shape -> its schedule (:meth:`schedule`)
    # traced stages: each module's class in the model, by name (FSDP's shard_modules match it)
    classes: dict[str, str] = field(default_factory=dict)

    @property
    def holds(self) -> list[int]:
        return self.plan.stages_of(self.pp_rank)

    @property
    def first(self) -> bool:
        return 0 in self.holds

    @property
    def last(self) -> bool:
        return self.plan.stages - 1 in self.holds

    @property
    def last_rank(self) -> int:
        """The rank in the pipeline that holds the last stage."""
        return self.plan.rank_of(self.plan.stages - 1)

    def schedule(self, model: Any, strategy: dict, device: torch.device, shape: tuple) -> Any:
        """The schedule of this run's stages for batches of ``shape``: torch's stages fix the
        shapes they send and receive at their first step, so each batch shape (the training
        batch, validation's) has its own; training and evaluation share one (torch's ``eval``
        is its step without backward)."""
        if shape not in self.built:
            self.built[shape] = build_schedule(model, self, strategy, device)
        return self.built[shape]

    def run(
        self, model: Any, strategy: dict, device: torch.device, batch: tuple, train: bool
    ) -> Any:
        """One batch through this rank's stages (``batch``: input ids and labels; with
        ``train``, losses too, which the last stage appends to): the first stage takes the
        inputs, the last the labels; ``train``: forward and backward, else forward only (the
        last stage still computes the schedule's loss). The last stage's outputs, None
        elsewhere."""
        inputs, labels, *losses = batch
        schedule = self.schedule(model, strategy, device, tuple(inputs.shape))
        args = (inputs,) if self.first else ()
        kwargs = {"target": labels, "losses": losses[0] if losses else []} if self.last else {}
        return (schedule.step if train else schedule.eval)(*args, **kwargs)

    def share_outputs(self, outputs: torch.Tensor | None) -> torch.Tensor:
        """The last stage's ``outputs`` on every rank of the pipeline (its shape and dtype
        sent first)."""
        import torch.distributed as torch_dist

        meta = [(tuple(outputs.shape), outputs.dtype) if outputs is not None else None]
        torch_dist.broadcast_object_list(meta, group=self.group, group_src=self.last_rank)
        shape, dtype = meta[0]  # type: ignore[misc]
        device = next(self.stages[0].parameters()).device
        out = outputs if outputs is not None else torch.empty(shape, dtype=dtype, device=device)
        torch_dist.broadcast(out, group=self.group, group_src=self.last_rank)
        return out


def split_for_pipeline(
    model: Any, strategy: dict, device: torch.device, matched: dict[str, str]
) -> PipelineParts:
    """The mesh ``(pp, dp_replicate, dp_shard, tp)`` (stages outermost, TP innermost: a
    stage's ranks are consecutive, so they share a node), ``model`` pruned to this rank's
    stages, their modules of the tensor-parallel plan split over ``tp`` (``matched``: the
    plan's modules of the whole model), and their stage modules; the pipeline declared to
    core/dist.py (every stage of a pipeline reads one batch)."""
    from torch.distributed.device_mesh import init_device_mesh

    from distributed_runner.core import dist
    from distributed_runner.parallel.tensor_parallel import apply_tensor_parallel

    plan = plan_stages(model, strategy)
    world, pp, tp = dist.get_world_size(), strategy["pp"], strategy.get("tp", 1)
    check_layout(strategy, world)
    replicate = strategy.get("dp_replicate", 1)
    dp = world // (pp * tp)
    mesh = init_device_mesh(
        device.type,
        (pp, replicate, dp // replicate, tp),
        mesh_dim_names=("pp", "dp_replicate", "dp_shard", "tp"),
    )
    group, pp_rank = mesh["pp"].get_group(), mesh["pp"].get_local_rank()
    dist.set_pipeline_layout(pp, group)
    # FSDP over a stage's data-parallel ranks: sharded within dp_shard, replicated across
    # dp_replicate (HSDP)
    data_mesh: Any = mesh["dp_replicate", "dp_shard"] if replicate > 1 else mesh["dp_shard"]
    data_mesh = data_mesh if dp > 1 else None
    if plan.traced:  # no TP within a traced stage (traced_stages.py refuses it)
        classes = {path: type(m).__name__ for path, m in model.named_modules()}
        stages = _traced_stages(model, plan, pp_rank, device)
        return PipelineParts(plan, stages, group, pp_rank, data_mesh, classes=classes)
    prune_to_stages(model, plan, pp_rank)
    if tp > 1:  # the plan's modules this rank still holds
        held = dict(model.named_modules())
        apply_tensor_parallel(model, {n: s for n, s in matched.items() if n in held}, mesh["tp"])
    stages = [DecoderStage(model, plan, s) for s in plan.stages_of(pp_rank)]
    return PipelineParts(plan, stages, group, pp_rank, data_mesh)


def _traced_stages(model: Any, plan: StagePlan, rank: int, device: torch.device) -> list[nn.Module]:
    """This rank's traced stages (parallel/traced_stages.py); ``model`` keeps only their
    parameters and buffers, the same objects under the same names."""
    from distributed_runner.parallel.traced_stages import keep_only, trace_stages

    if any(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()]):
        raise AssertionError("a model is given storage before its trace (model/build.py)")
    stages = trace_stages(model, list(plan.names[1:]), device)
    mine = [stages[s] for s in plan.stages_of(rank)]
    keep_only(model, {name for stage in mine for name in stage.state_dict()})
    return mine


class DecoderStage(nn.Module):
    """The forward of one stage: the embedding (first stage), its decoder layers with the
    rotary embeddings and causal mask the base model's forward makes, and the final norm and
    head (last stage). Its modules are the (pruned) model's own objects."""

    def __init__(self, model: Any, plan: StagePlan, stage: int) -> None:
        super().__init__()
        prefix, base = _decoder(model)  # type: ignore[misc]
        units = plan.units(stage)
        self.config = model.config
        self.embed = base.embed_tokens if f"{prefix}.embed_tokens" in units else None
        self.layers = nn.ModuleList(
            base.layers[name.rsplit(".", 1)[1]] for name in units if ".layers." in name
        )
        last = "lm_head" in units
        self.norm: Any = base.norm if last else None
        self.head: Any = model.lm_head if last else None
        self.rotary = [base.rotary_emb]  # a list: not a child (its buffers are the model's)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            hidden = self.embed(hidden)
        if len(self.layers):
            positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
            rotary = self.rotary[0](hidden, position_ids=positions)
            mask = causal_mask(self.config, hidden, positions)
            for layer in self.layers:
                out = layer(
                    hidden, attention_mask=mask, position_embeddings=rotary, position_ids=positions
                )
                hidden = out[0] if isinstance(out, tuple) else out
        if self.head is not None:
            hidden = self.head(self.norm(hidden))
        return hidden


def causal_mask(config: Any, hidden: torch.Tensor, positions: torch.Tensor) -> Any:
    """The causal mask the model's own forward builds for a batch without padding
    (transformers' ``create_causal_mask``, whose arguments changed names across versions)."""
    from transformers.masking_utils import create_causal_mask

    wanted = inspect.signature(create_causal_mask).parameters
    embeds = "inputs_embeds" if "inputs_embeds" in wanted else "input_embeds"
    given = {"config": config, embeds: hidden, "attention_mask": None, "position_ids": positions}
    given["cache" if "cache" in wanted else "past_key_values"] = None  # one: the other is old
    if "cache_position" in wanted:
        given["cache_position"] = positions[0]
    return create_causal_mask(**{k: v for k, v in given.items() if k in wanted})


def build_schedule(model: Any, parts: PipelineParts, strategy: dict, device: torch.device) -> Any:
    """torch's schedule over this rank's stage modules; the last stage's loss is the model's
    own (``loss_function``, the causal LM's shifted cross-entropy)."""
    from torch.distributed import pipelining

    plan = parts.plan
    stages = [
        _stage_class()(module, s, plan.stages, device, group=parts.group)
        for module, s in zip(parts.stages, parts.holds, strict=True)
    ]
    vocab = model.config.vocab_size

    def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return model.loss_function(logits=logits, labels=labels, vocab_size=vocab)

    cls = getattr(pipelining, SCHEDULES[strategy["pp_schedule"]][0])
    count = microbatches(strategy)
    if plan.looped:
        return cls(stages, n_microbatches=count, loss_fn=loss_fn)
    return cls(stages[0], n_microbatches=count, loss_fn=loss_fn)


def _stage_class() -> type:
    """torch's PipelineStage, except in a forward-only run: there a V schedule's turn (the
    middle two stages on one rank) still hands the gradients of the upper stage's inputs to the
    lower one without a send, and torch 2.13 asserts that a stage without backward has none to
    hand (``can't steal_bwd_input``). Every other backward action of such a run is already a
    no-op in torch (no gradient is received, computed or sent), so the hand-over is skipped."""
    from torch.distributed.pipelining import PipelineStage

    class ForwardOnlyAwareStage(PipelineStage):
        def get_local_bwd_output(self, mb_index: int) -> Any:
            return super().get_local_bwd_output(mb_index) if self.has_backward else ()

        def set_local_bwd_input(self, next_stage_bwd_outputs: Any, mb_index: int) -> None:
            if self.has_backward:
                super().set_local_bwd_input(next_stage_bwd_outputs, mb_index)

    return ForwardOnlyAwareStage


# -- the stages' checkpoint: the one-process checkpoint -----------------------------------------
def _gather_to_first(value: Any) -> list | None:
    """``value`` of every rank of this rank's pipeline, on the pipeline's first rank (None
    elsewhere)."""
    import torch.distributed as torch_dist

    from distributed_runner.core import dist

    group = dist.get_pipeline_group()
    first = torch_dist.get_rank(group) == 0
    parts: list | None = [None] * dist.get_pipeline_size() if first else None
    torch_dist.gather_object(value, parts, group=group, group_dst=0)
    return parts


def gathered_weights(model: nn.Module, plan: StagePlan) -> dict:
    """Every stage's weights under their full names, in the whole model's order, on rank 0
    ({} elsewhere): a collective over the pipeline."""
    local = {k: _to_cpu(v) for k, v in model.state_dict().items()}  # a stage's dp: gathered
    parts = _gather_to_first(local)
    if parts is None:
        return {}
    merged = [item for part in parts for item in part.items()]
    return dict(sorted(merged, key=lambda kv: plan.position(kv[0])))


def gathered_tensors(state: dict) -> dict:
    """``state`` (a stage's tensors by full name, such as an average's) merged with every
    other stage's, whole, on the pipeline's first rank (this rank's own elsewhere)."""
    parts = _gather_to_first({k: _to_cpu(v) for k, v in state.items()})
    if parts is None:
        return state
    return {k: v for part in parts for k, v in part.items()}


def gathered_optimizer(model: nn.Module, optimizer: Any, plan: StagePlan) -> dict:
    """The optimizer state of every stage, as one process's optimizer over the whole model
    would hold it (indices in the model's parameter order), on rank 0 ({} elsewhere); its
    ``param_names`` say which parameter each index is, for a resume on stages again. One group
    a rank (the default constructor) makes one group; several (paramwise_cfg's, a parameter
    each) are ordered by their first parameter."""
    names = {id(p): n for n, p in model.named_parameters()}
    saved = optimizer.state_dict()
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    local = {
        "state": {order[i]: _to_cpu(st) for i, st in saved["state"].items()},
        "groups": [
            {**_options(g), "params": [order[i] for i in g["params"]]}
            for g in saved["param_groups"]
        ],
    }
    parts = _gather_to_first(local)
    if parts is None:
        return {}
    every = [n for part in parts for g in part["groups"] for n in g["params"]]
    every.sort(key=plan.position)
    index = {n: i for i, n in enumerate(every)}
    groups = [g for part in parts for g in part["groups"]]
    if all(len(part["groups"]) == 1 for part in parts):
        groups = [{**groups[0], "params": [n for g in groups for n in g["params"]]}]
    groups.sort(key=lambda g: index[g["params"][0]] if g["params"] else len(index))
    for g in groups:
        g["params"].sort(key=index.__getitem__)
    state = {index[n]: st for part in parts for n, st in part["state"].items()}
    return {
        "state": state,
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in groups],
        "param_names": [list(g["params"]) for g in groups],
    }


def _placed(value: Any, param: torch.Tensor) -> Any:
    """An optimizer state's whole tensor shaped as its parameter, cut as the parameter is."""
    if torch.is_tensor(value) and value.dim() and value.shape == param.shape:
        return shard_like(value, param)
    return value


def _options(group: dict) -> dict:
    return {k: v for k, v in group.items() if k not in ("params", "param_names")}


def _to_cpu(value: Any) -> Any:
    """Tensors whole (a stage's FSDP shards gathered: a collective over its ranks) on the CPU."""
    if torch.is_tensor(value):
        whole = value.full_tensor() if hasattr(value, "full_tensor") else value
        return whole.detach().cpu().clone()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def load_stage_weights(model: Any, state: dict, path: Any, key: str = "resume") -> None:
    """This rank's stages' weights out of a whole model's (every one of them must be there;
    ``key``: the config key that named ``path``)."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    if missing:
        raise ConfigError(key, f"{path} has no {missing[0]!r}: is it a checkpoint of this model?")
    with torch.no_grad():
        for key, target in own.items():  # into this rank's shards under FSDP
            local_tensor(target).copy_(local_tensor(shard_like(state[key], target)))


def load_stage_optimizer(model: nn.Module, optimizer: Any, saved: dict, path: Any) -> None:
    """This rank's part of :func:`gathered_optimizer`'s state (its ``param_names`` map it)."""
    if "param_names" not in saved:
        raise ConfigError(
            "resume",
            f"{path} was written by one process (its optimizer state names no parameter): "
            f"resuming it on pipeline stages is not built yet; resume it in one process",
        )
    pairs = zip(saved["param_groups"], saved["param_names"], strict=True)
    where = {
        n: (g, i)
        for g, (group, group_names) in enumerate(pairs)
        for i, n in zip(group["params"], group_names, strict=True)
    }
    names = {id(p): n for n, p in model.named_parameters()}
    state, groups, local = {}, [], 0
    for group in optimizer.param_groups:
        found = [where[names[id(p)]] for p in group["params"]]
        options = _options(saved["param_groups"][found[0][0]])
        groups.append({**options, "params": list(range(local, local + len(found)))})
        for param, (_, index) in zip(group["params"], found, strict=True):
            if index in saved["state"]:
                state[local] = {k: _placed(v, param) for k, v in saved["state"][index].items()}
            local += 1
    optimizer.load_state_dict({"state": state, "param_groups": groups})
