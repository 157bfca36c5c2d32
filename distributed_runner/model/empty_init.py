"""A model built without its weights, for weights that come from files (``load_from`` a Hugging
Face directory).

Why: a model that will be overwritten by pretrained weights need not be initialised first, and
under FSDP it must not be whole on any rank — 8 ranks each holding an 8B model in host memory
before sharding is what loading is for to avoid. So the model is built with its *parameters* on
the meta device (no memory, no init), sharded, then given real but uninitialised storage of
only this rank's shards (:func:`materialize`) which the loader fills.

Buffers are built for real: they are small, and many are computed in ``__init__`` and never
saved (the rotary ``inv_freq`` of Llama, non-persistent), so a file could not restore them.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Inside: every parameter a module registers lives on the meta device (shape and dtype,
    no storage); buffers and plain tensors are built as usual."""
    original = nn.Module.register_parameter
    # one meta copy per parameter, so ties stay ties; the original is only weakly held (it is
    # the memory this avoids), and an id counts only while its original is alive
    copies: dict[int, tuple[weakref.ref, nn.Parameter]] = {}

    def register_on_meta(module: nn.Module, name: str, param: Any) -> None:
        # plain parameters only: a subclass (nn.UninitializedParameter, a library's own) keeps
        # its type and its storage, and materialize() keeps its values
        if type(param) is nn.Parameter and param.device.type != "meta":
            known = copies.get(id(param))
            if known is None or known[0]() is not param:
                meta = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
                meta.__dict__.update(param.__dict__)
                known = copies[id(param)] = (weakref.ref(param), meta)
            param = known[1]
        original(module, name, param)

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def materialize_module(module: nn.Module, device: torch.device | str = "cpu") -> None:
    """Give ``module``'s own (not its children's) meta parameters real, uninitialised storage
    on ``device``, keeping the parameter objects' roles (aliases stay aliases)."""
    module.to_empty(device=device, recurse=False)


def materialize(model: nn.Module, device: torch.device) -> None:
    """Storage on ``device`` for the parameters still on the meta device — after sharding, only
    this rank's shards — keeping every tensor that already holds values (buffers, parameters
    initialised on purpose). Goes through ``to_empty``, which FSDP2 follows to re-point its
    shards; the kept values are copied back afterwards."""
    kept = {
        name: _local(t).detach().clone()
        for name, t in [*model.named_parameters(), *model.named_buffers()]
        if _local(t).device.type != "meta" and not is_lazy(t)
    }
    tied = _tied_groups(model)
    model.to_empty(device=device)
    for group in tied:  # to_empty gives each module its own new tensor: one again
        first = getattr(*group[0])
        for module, leaf in group[1:]:
            if getattr(module, leaf) is not first:
                setattr(module, leaf, first)
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if name in kept:
                _local(t).copy_(kept[name])


def _tied_groups(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """(module, attribute) pairs that hold one parameter object, per parameter held by several
    (tied embeddings: ``lm_head.weight`` is ``embed_tokens.weight``)."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for leaf, param in module._parameters.items():
            if param is not None:
                holders.setdefault(id(param), []).append((module, leaf))
    return [group for group in holders.values() if len(group) > 1]


def is_lazy(t: torch.Tensor) -> bool:
    """An ``nn.LazyLinear``'s parameter before its first forward: no shape, nothing to keep."""
    return isinstance(t, nn.parameter.UninitializedTensorMixin)  # type: ignore[attr-defined]


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (a plain tensor itself)."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t
