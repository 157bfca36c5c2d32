"""Stages of a model with no pipeline plan, cut where ``strategy.pp_split`` says by tracing it.

A causal LM without transformers' ``base_model_pp_plan`` (GPT-2, OPT, Bloom, GPT-NeoX ...) has
no stage forward written for it. torch's tracing frontend (``torch.export`` of the model's own
forward, split before each module ``pp_split`` names) gives one graph a stage, each keeping the
model's module hierarchy: the parameters are the model's own objects under their full names.

torch's runtime for traced stages lets a stage read any earlier stage's values and sizes, but it
fixes every shape at the trace. So the graphs are traced once with free batch and sequence
sizes and rewired (:func:`rewire`) for torch's manual ``PipelineStage``, which takes each
batch's shapes at run time:

* a value a later stage reads (a mask stage 0 built, read by stage 2) is handed on by every
  stage between, so each stage reads only the one before it;
* a size (``batch``, ``sequence``) is not sent: the stage reads it off a tensor it receives.

What a trace cannot keep is refused in one line by :func:`check_traceable`, before anything is
built (on the Ray driver too): a mode (dropout is fixed on or off in the graph; functional
dropout only the trace shows), a weight two stages share, tensor parallelism (it splits
modules the graph no longer calls). FSDP's ``shard_modules`` and ``activation_checkpointing``
match the stages' modules by the model's class names.

The stages' graphs hold the model's parameter objects; the model keeps only this rank's
(:func:`keep_only`), and takes back the stages' new ones once FSDP has sharded them
(:func:`adopt_tensors`): the optimizer, the hooks and the checkpoint see the model as under a
plan's cut. ``Pipe._from_traced`` is torch's private step behind ``pipeline()``, which exports
with every size fixed.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any

import torch
from torch import fx, nn

from distributed_runner.core.errors import ConfigError, did_you_mean

KEY = "strategy.pp_split"
Wire = tuple[int, int]  # (the stage that makes a value (-1: the model's input), its index there)


def check_traceable(model: Any, strategy: dict) -> None:
    """What a traced cut of ``model`` cannot run, one line each."""
    name = type(model).__name__
    if not callable(getattr(model, "loss_function", None)) or not hasattr(
        getattr(model, "config", None), "vocab_size"
    ):
        raise ConfigError(
            KEY,
            f"{name} is not a causal LM (a Hugging Face *ForCausalLM: input_ids in, logits "
            f"out, config.vocab_size and loss_function): pipeline stages train causal LMs",
        )
    for split in strategy["pp_split"]:
        try:
            model.get_submodule(split)
        except AttributeError:
            modules = [n for n, _ in model.named_modules()]
            hint = did_you_mean(split, modules)
            raise ConfigError(KEY, f"{name} has no module {split!r}{hint}") from None
    _refuse_modes_and_sharing(model, name)
    if strategy.get("tp", 1) > 1:
        raise ConfigError(
            KEY,
            f"{name} is cut by tracing (no pipeline plan), and tp > 1 splits the model's "
            f"modules, which a traced graph no longer calls: set tp=1",
        )


def _refuse_modes_and_sharing(model: nn.Module, name: str) -> None:
    """A trace fixes the training mode (dropout stays on in evaluation) and cannot give two
    stages one weight."""
    dropout = next(
        (n for n, m in model.named_modules() if isinstance(m, nn.Dropout) and m.p > 0), None
    )
    if dropout is not None:
        raise ConfigError(
            KEY,
            f"{name}.{dropout} drops with p > 0, but a traced stage fixes dropout on or off for "
            f"training and evaluation alike: set the model config's dropout to 0",
        )
    every = list(model.named_parameters(remove_duplicate=False))
    if len(every) != len(list(model.named_parameters())):
        raise ConfigError(
            KEY,
            f"{name} shares a weight between modules (tied embeddings?), which two stages "
            f"cannot share: untie it in the model's config (tie_word_embeddings=False)",
        )


def trace_stages(model: nn.Module, split: list[str], device: torch.device) -> list[nn.Module]:
    """``model``'s stages, cut before each module of ``split``: one graph module a stage whose
    parameters are ``model``'s own under their full names, rewired (:func:`rewire`)."""
    from torch.distributed.pipelining import SplitPoint
    from torch.distributed.pipelining._IR import (
        MultiUseParameterConfig,
        Pipe,
        annotate_split_points,
    )
    from torch.export import Dim

    example = torch.zeros(2, 8, dtype=torch.long, device=device)  # sizes left free below
    annotate_split_points(model, dict.fromkeys(split, SplitPoint.BEGINNING))
    kwargs: dict[str, Any] = {"input_ids": example}
    if "use_cache" in inspect.signature(model.forward).parameters:
        kwargs["use_cache"] = False  # a key/value cache is an output no stage sends
    free = {"input_ids": {0: Dim.AUTO, 1: Dim.AUTO}}
    try:
        exported = torch.export.export(
            model, (), kwargs, dynamic_shapes={**dict.fromkeys(kwargs), **free}
        )
    except Exception as error:  # torch.export's reasons are many and long: its first line
        first = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        raise ConfigError(
            KEY,
            f"{type(model).__name__}'s forward could not be traced to cut it "
            f"({type(error).__name__}: {first})",
        ) from error
    finally:
        _unmark_split_points(model, split)
    _refuse_traced_dropout(exported.graph, type(model).__name__)
    pipe = Pipe._from_traced(
        model, exported, MultiUseParameterConfig.REPLICATE, output_loss_value_spec=None
    )
    stages = [pipe.get_stage_module(i) for i in range(pipe.num_stages)]
    if len(stages) != len(split) + 1:
        raise ConfigError(
            KEY,
            f"the trace made {len(stages)} stage(s) of {len(split) + 1}: a name of pp_split is "
            f"not called in {type(model).__name__}'s forward, or twice",
        )
    rewire(pipe.split_gm, stages)
    return stages


def _refuse_traced_dropout(graph: fx.Graph, name: str) -> None:
    """Dropout the modules did not show (``F.dropout`` with a config's rate, as OPT's and
    GPT-NeoX's layers call it): the trace holds it with its rate, fixed on."""
    for node in graph.nodes:
        if node.target is torch.ops.aten.dropout.default and node.args[1] > 0 and node.args[2]:
            raise ConfigError(
                KEY,
                f"{name}'s forward drops with p={node.args[1]} ({node.name}), but a traced stage "
                f"fixes dropout on for evaluation too: set the model config's dropout to 0",
            )


def _unmark_split_points(model: nn.Module, split: list[str]) -> None:
    """torch's ``annotate_split_points`` wraps each module's forward to mark the cut (the one it
    had kept in ``_orig_forward``); after the trace each module has its own forward again."""
    for name in split:
        module = model.get_submodule(name)
        original = module.__dict__.pop("_orig_forward", None)
        module.__dict__.pop("forward", None)
        if original is not None and getattr(original, "__func__", None) is not type(module).forward:
            module.forward = original  # an instance's own forward, as it was


def rewire(root: fx.GraphModule, stages: list[nn.Module]) -> None:
    """The traced stages changed in place so that stage ``k`` reads only stage ``k - 1``'s
    tensors: the values later stages read are handed on, sizes are read off a tensor."""
    calls = [n for n in root.graph.nodes if n.op == "call_module"]
    inputs = [n for n in root.graph.nodes if n.op == "placeholder"]
    reads = [[_wire(arg, calls, inputs) for arg in call.args] for call in calls]
    tensors = [
        [w for w, meta in zip(wires, _placeholder_values(stage), strict=True) if _is_tensor(meta)]
        for wires, stage in zip(reads, stages, strict=True)
    ]
    carried: list[list[Wire]] = [[] for _ in stages]  # what stage k receives, in order
    for k in range(len(stages) - 1, 0, -1):
        later = carried[k + 1] if k + 1 < len(stages) else []
        wanted = tensors[k] + [w for w in later if w[0] < k]
        carried[k] = list(dict.fromkeys(wanted))
    for k, stage in enumerate(stages):
        receives = [(-1, i) for i in range(len(inputs))] if k == 0 else carried[k]
        sends = carried[k + 1] if k + 1 < len(stages) else None
        _rewire_stage(stage, reads[k], receives, sends, k)


def _wire(arg: Any, calls: list[fx.Node], inputs: list[fx.Node]) -> Wire:
    if arg.op == "placeholder":
        return (-1, inputs.index(arg))
    if arg.op == "call_function" and arg.target is operator.getitem:
        return (calls.index(arg.args[0]), int(arg.args[1]))
    return (calls.index(arg), 0)  # a stage with one output


def _placeholder_values(stage: nn.Module) -> list[Any]:
    return [n.meta.get("val") for n in stage.graph.nodes if n.op == "placeholder"]  # type: ignore[union-attr]


def _is_tensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor)


def _rewire_stage(
    stage: Any, reads: list[Wire], receives: list[Wire], sends: list[Wire] | None, k: int
) -> None:
    """Stage ``k`` takes ``receives`` (its own reads and what it hands on), reads each size off
    a tensor it takes, and returns ``sends`` (None: the last stage, its one output)."""
    graph: fx.Graph = stage.graph
    old = [n for n in graph.nodes if n.op == "placeholder"]
    body = next(n for n in graph.nodes if n.op != "placeholder")
    taken: dict[Wire, fx.Node] = dict(zip(reads, old, strict=True)) if k == 0 else {}
    if k > 0:
        with graph.inserting_before(old[0]):
            for j, wire in enumerate(receives):
                taken[wire] = graph.placeholder(f"received_{j}")
        tensors = [(p, w) for p, w in zip(old, reads, strict=True) if _is_tensor(p.meta["val"])]
        for node, wire in tensors:
            taken[wire].meta = dict(node.meta)
            node.replace_all_uses_with(taken[wire])
        for node in old:
            if not _is_tensor(node.meta.get("val")):
                node.replace_all_uses_with(_size_node(graph, body, node, tensors, taken, k))
        for node in old:
            graph.erase_node(node)
    output = next(n for n in graph.nodes if n.op == "output")
    own = output.args[0]
    own = list(own) if isinstance(own, (tuple, list)) else [own]
    if sends is None:
        if len(own) != 1:
            raise ConfigError(KEY, f"the last stage returns {len(own)} values: logits only")
        output.args = (own[0],)
    else:
        output.args = (tuple(own[w[1]] if w[0] == k else taken[w] for w in sends),)
    graph.lint()
    stage.recompile()


def _size_node(
    graph: fx.Graph,
    body: fx.Node,
    node: fx.Node,
    tensors: list[tuple[fx.Node, Wire]],
    taken: dict[Wire, fx.Node],
    k: int,
) -> fx.Node:
    """A size stage ``k`` was handed (``batch``, ``sequence``), read off a tensor it takes."""
    symbol = str(node.meta.get("val"))
    for source, wire in tensors:
        for dim, size in enumerate(source.meta["val"].shape):
            if str(size) == symbol:
                with graph.inserting_before(body):
                    return graph.call_function(torch.ops.aten.sym_size.int, (taken[wire], dim))
    raise ConfigError(
        KEY,
        f"stage {k} is handed a size ({symbol}) that none of its tensors has: cut elsewhere",
    )


def keep_only(model: nn.Module, held: set[str]) -> None:
    """``model`` without the modules, parameters and (saved) buffers of other ranks' stages: a
    module none of whose state this rank holds becomes None (as a decoder's dropped units do),
    so what stays is this rank's, under the same names, and every module left is whole. The
    optimizer, the hooks and the checkpoint see one stage of the model (its forward is no
    longer called: the stages run)."""
    names = list(model.state_dict())
    for path in [name for name, _ in model.named_modules()]:
        if not path or _detached(model, path):
            continue
        inside = [n for n in names if n.startswith(f"{path}.")]
        if inside and not any(n in held for n in inside):
            parent, _, child = path.rpartition(".")
            model.get_submodule(parent)._modules[child] = None
    for name in names:
        if name not in held and not _detached(model, name):
            owner_name, _, leaf = name.rpartition(".")
            owner = model.get_submodule(owner_name)
            owner._parameters.pop(leaf, None)
            owner._buffers.pop(leaf, None)


def _detached(model: nn.Module, name: str) -> bool:
    """Whether a module on the way to ``name`` was dropped."""
    module: Any = model
    for part in name.split(".")[:-1]:
        module = module._modules.get(part)
        if module is None:
            return True
    return False


def adopt_tensors(model: nn.Module, stages: list[nn.Module]) -> None:
    """``model``'s parameters and buffers made the stages' own objects again, name by name:
    sharding a traced stage gives it new ones (FSDP's shards), which the optimizer, the hooks
    and the checkpoint must see through ``model``."""
    for stage in stages:
        for name, param in stage.named_parameters():
            owner_name, _, leaf = name.rpartition(".")
            model.get_submodule(owner_name)._parameters[leaf] = param
        for name, buffer in stage.named_buffers():
            owner_name, _, leaf = name.rpartition(".")
            model.get_submodule(owner_name)._buffers[leaf] = buffer
