"""Tensor parallelism: a plan of module-name patterns to styles, checked against the model and
applied with ``torch.distributed.tensor.parallel.parallelize_module`` on the mesh's ``tp``
dimension.

The plan is the config's ``strategy.tp_plan`` or the model's own: transformers ships one for
Llama, Qwen, Mistral and others (``model.tp_plan``: the base model's ``base_model_tp_plan``
under its prefix plus the head's, e.g. ``lm_head: colwise_gather_output``). Its names are
transformers' and mean the same here::

    tp_plan = {
        'model.embed_tokens': 'embedding_rowwise',     # vocabulary rows split, output summed
        'model.layers.*.self_attn.q_proj': 'colwise',  # output features split (heads)
        'model.layers.*.self_attn.o_proj': 'rowwise',  # input features split, output summed
        'lm_head': 'colwise_gather_output',            # logits split, then gathered whole
    }

``*`` stands for one component of a module's name (a layer number). A colwise layer followed by
a rowwise one needs one all-reduce in forward and one in backward; everything between them (the
attention over its local heads, the MLP's activation) runs on the local slice. Modules the plan
does not name (the layer norms, rotary embeddings) stay whole on every rank of the group and,
since their inputs are whole too, compute the same values and gradients there. A module between
a colwise and a rowwise layer that has weights of its own (Qwen3's per-head ``q_norm``) sees
only this rank's heads, so its gradient is partial: ``replicated_with_grad_allreduce`` keeps it
whole and sums its gradient over the group (:class:`_SumOverGroup`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import nn

from distributed_runner.core.errors import ConfigError, did_you_mean

PLAN_KEY = "strategy.tp_plan"


def _colwise() -> Any:
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel()


def _colwise_gathered() -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel(output_layouts=Replicate())


def _rowwise() -> Any:
    from torch.distributed.tensor.parallel import RowwiseParallel

    return RowwiseParallel()


def _rowwise_whole_input() -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import RowwiseParallel

    return RowwiseParallel(input_layouts=Replicate())


# style -> (the torch ParallelStyle it makes, the module types it takes, the weight dim it splits;
# None: applied by this module, not torch's parallelize_module, and nothing split)
STYLES: dict[str, tuple[Callable[[], Any] | None, tuple[type, ...], int | None]] = {
    "colwise": (_colwise, (nn.Linear,), 0),
    "colwise_gather_output": (_colwise_gathered, (nn.Linear,), 0),
    "colwise_rep": (_colwise_gathered, (nn.Linear,), 0),
    "rowwise": (_rowwise, (nn.Linear,), 1),
    "rowwise_split_input": (_rowwise_whole_input, (nn.Linear,), 1),
    "embedding_rowwise": (_rowwise_whole_input, (nn.Embedding,), 0),
    "replicated_with_grad_allreduce": (None, (nn.Module,), None),
}
NOT_YET = {
    "sequence_parallel": "sequence parallelism (norms and dropout on sequence slices) is not "
    "supported yet: leave the norms out of the plan (they then run whole on every rank)",
}


class Plan(NamedTuple):
    """A tensor-parallel plan and where it came from (for errors the user can act on)."""

    entries: dict[str, str]
    own: bool  # the model's own plan, not strategy.tp_plan

    def where(self, key: str) -> str:
        """The config key an error names: the user's entry, or the strategy whose model
        brought the plan."""
        return f"{PLAN_KEY}[{key!r}]" if not self.own else "strategy.tp"

    def say(self, key: str, message: str) -> str:
        if not self.own:
            return message
        return (
            f"the model's own plan entry {key!r} {message}; give strategy.tp_plan=dict(...) "
            f"to choose the entries"
        )


def resolve_plan(model: nn.Module, configured: dict | None) -> Plan:
    """The plan to apply: ``strategy.tp_plan`` when given, else the model's own; one line when
    there is neither."""
    if configured is not None:
        if not isinstance(configured, dict) or not configured:
            raise ConfigError(
                PLAN_KEY,
                f"got {configured!r:.60}; takes a dict of module-name patterns to styles, "
                f"e.g. {{'layers.*.attn.qkv': 'colwise', 'layers.*.attn.proj': 'rowwise'}}",
            )
        return Plan({str(k): str(v) for k, v in configured.items()}, own=False)
    own = getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None)
    if isinstance(own, dict) and own:
        return Plan({str(k): str(v) for k, v in own.items()}, own=True)
    raise ConfigError(
        "strategy.tp",
        f"{type(model).__name__} has no tensor-parallel plan of its own (transformers ships "
        f"one for Llama, Qwen, Mistral...): give one as strategy.tp_plan=dict(...)",
    )


def _pattern(name: str) -> re.Pattern:
    """A plan key as a regular expression over module names (``*``: one name component)."""
    return re.compile(r"[^.]+".join(re.escape(part) for part in name.split("*")))


def match_plan(model: nn.Module, plan: Plan) -> dict[str, str]:
    """Each module the plan names, with its style; one-line errors for an unknown style, a
    pattern that matches nothing (a typo must not leave layers whole), a module two patterns
    name, or a module the style cannot split."""
    modules = dict(model.named_modules())
    matched: dict[str, str] = {}
    for key, style in plan.entries.items():
        _check_style(plan, key, style)
        pattern = _pattern(key)
        names = [n for n in modules if n and pattern.fullmatch(n)]
        if not names:
            close = did_you_mean(key, [n for n in modules if n])
            raise ConfigError(
                plan.where(key),
                plan.say(
                    key,
                    f"matches no module of {type(model).__name__}{close} ('*' stands for one "
                    f"name component, e.g. a layer number)",
                ),
            )
        for name in names:
            _check_module(plan, key, name, modules[name], style)
            if matched.get(name, style) != style:
                raise ConfigError(
                    plan.where(key),
                    plan.say(key, f"names {name}, which another entry splits as {matched[name]}"),
                )
            matched[name] = style
    return matched


def _check_style(plan: Plan, key: str, style: str) -> None:
    if style in NOT_YET:
        raise ConfigError(plan.where(key), plan.say(key, NOT_YET[style]))
    if style not in STYLES:
        raise ConfigError(
            plan.where(key),
            plan.say(
                key,
                f"has style {style!r}, which is not supported{did_you_mean(style, STYLES)}; "
                f"styles: {', '.join(STYLES)}",
            ),
        )


def _check_module(plan: Plan, key: str, name: str, module: nn.Module, style: str) -> None:
    types = STYLES[style][1]
    if not isinstance(module, types):
        raise ConfigError(
            plan.where(key),
            plan.say(
                key,
                f"names {name}, a {type(module).__name__}; style {style!r} splits "
                f"{' or '.join(t.__name__ for t in types)} modules only (name the linear layers "
                f"inside it; adapters such as LoRA's are not split)",
            ),
        )


def check_divisible(model: nn.Module, matched: dict[str, str], tp: int) -> None:
    """Every split weight dimension and the model's attention heads divide by ``tp``: an uneven
    split would give ranks different numbers of heads, which attention cannot reshape."""
    config = getattr(model, "config", None)
    for attr in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, attr, None)
        if isinstance(heads, int) and heads % tp:
            raise ConfigError(
                "strategy.tp",
                f"{tp} does not divide the model's {attr}={heads}: each rank of a "
                f"tensor-parallel group takes whole heads (use a tp that divides {heads})",
            )
    modules = dict(model.named_modules())
    for name, style in matched.items():
        dim = STYLES[style][2]
        if dim is None:
            continue
        size = modules[name].weight.shape[dim]
        if size % tp:
            raise ConfigError(
                f"{PLAN_KEY}[{name!r}]",
                f"{style} splits dimension {dim} of its weight, {size}, which tp={tp} does not "
                f"divide",
            )


def apply_tensor_parallel(model: nn.Module, matched: dict[str, str], tp_mesh: Any) -> None:
    """Split the matched modules over ``tp_mesh`` in place (their weights become DTensors whose
    values come from rank 0's, so every rank of a group starts from the same model). Weights
    tied before (an embedding and its output layer) are tied again after, when both are split
    the same way."""
    from torch.distributed.tensor.parallel import parallelize_module

    ties = _tied_parameters(model)
    styles = {name: make() for name, s in matched.items() if (make := STYLES[s][0]) is not None}
    parallelize_module(model, tp_mesh, styles)
    _retie(model, ties)
    for name, style in matched.items():
        if style == "replicated_with_grad_allreduce":
            _sum_gradients_over_group(model.get_submodule(name), tp_mesh.get_group())


def _tied_parameters(model: nn.Module) -> list[list[tuple[str, str]]]:
    """Groups of (module name, parameter name) holding one tensor (ties), before splitting."""
    seen: dict[int, list[tuple[str, str]]] = {}
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            seen.setdefault(id(param), []).append((module_name, param_name))
    return [group for group in seen.values() if len(group) > 1]


def _retie(model: nn.Module, ties: list[list[tuple[str, str]]]) -> None:
    for (first_module, first_name), *others in ties:
        param = getattr(model.get_submodule(first_module), first_name)
        for module_name, name in others:
            module = model.get_submodule(module_name)
            other = getattr(module, name)
            if other is param:
                continue
            if getattr(other, "placements", None) != getattr(param, "placements", None):
                raise ConfigError(
                    PLAN_KEY,
                    f"{first_module}.{first_name} and {module_name}.{name} are one tied weight "
                    f"but the plan splits them differently: give both the same split "
                    f"(embedding_rowwise with colwise_gather_output) or neither",
                )
            setattr(module, name, param)


class _SumOverGroup(torch.autograd.Function):
    """The identity in forward; in backward the gradient summed over the tensor-parallel group
    (each rank's gradient covers only the heads it holds)."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


def _sum_gradients_over_group(module: nn.Module, group: Any) -> None:
    """Route ``module``'s own parameters through :class:`_SumOverGroup` while it runs. The
    parameter objects are read at each call, so this holds after FSDP swaps its gathered
    parameters in; they are put back as they were when the forward returns."""
    original = module.forward
    names = [n for n, _ in module.named_parameters(recurse=False)]

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        own = module._parameters
        held = {n: own[n] for n in names}
        try:
            for n, param in held.items():
                if param is not None and param.requires_grad:
                    own[n] = _SumOverGroup.apply(param, group)
            return original(*args, **kwargs)
        finally:
            own.update(held)

    module.forward = forward
