"""``strategy=dict(..., activation_checkpointing=['Block'])``: activation checkpointing. The
modules of the named classes keep only their inputs for backward; what their forward computed
inside is recomputed when backward reaches them (one more forward of those modules per step,
for the activations' memory).

Why not ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper``: it puts each module
inside a wrapper, so every parameter's key gains ``_checkpoint_wrapped_module.`` and a
checkpoint written with activation checkpointing would not load into a run without it. Here the
module tree is left as it is: only the module's ``forward`` is replaced, on the instance, by one
that runs the class's ``forward`` under ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``.
So ``state_dict()`` keys, ``named_modules()`` and the class names ``shard_modules`` matches stay
the same; module hooks (FSDP2's gathering of a unit's parameters) stay outside the recomputed
region and run once, as ``nn.Module.__call__`` calls them around ``forward``; and
``torch.compile`` traces the checkpoint as it traces any non-reentrant one.
"""

from __future__ import annotations

import inspect
import logging
import types
from typing import Any, cast

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from distributed_runner.core.errors import ConfigError, did_you_mean
from distributed_runner.core.log import LOGGER_NAME

# arguments of Hugging Face layers that carry a key/value cache: a recomputed forward would
# append to the cache a second time, so (as transformers' own gradient checkpointing does) a
# recomputed layer trains without one: these become None, ``use_cache`` False. transformers
# 5.24 names a layer's argument ``cache`` (before: ``past_key_values``/``past_key_value``)
CACHE_ARGS = ("past_key_values", "past_key_value", "layer_past", "cache", "cache_params")
OFF = {**dict.fromkeys(CACHE_ARGS), "use_cache": False}


def check_module_classes(model: nn.Module, names: list[str], key: str) -> None:
    """Every name in ``names`` is the class of a module of ``model``; else a one-line error
    naming the config ``key`` (a misspelled name must not quietly change nothing)."""
    present = {type(m).__name__ for m in model.modules()}
    for name in names:
        if name not in present:
            raise ConfigError(
                key,
                f"the model has no module of class {name!r}{did_you_mean(name, sorted(present))}",
            )


def _recomputed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The class's forward, its activations recomputed in backward when it trains (in eval
    mode or without gradients nothing is saved for backward: it runs as it is).

    A bound method on the instance rather than a closure: ``copy.deepcopy`` (EMA's copy of the
    model) rebinds a bound method to the copy, while it would share a closure with the original.
    """
    forward = type(self).forward
    if not (self.training and torch.is_grad_enabled()):  # validation, inference, no_grad
        return forward(self, *args, **kwargs)
    # set on the instance by apply_activation_checkpointing (Module attributes type as Tensor)
    for name, index in cast(list[tuple[str, int]], self._recompute_cache_args):
        if index < len(args) and args[index] is not None:
            args = (*args[:index], OFF[name], *args[index + 1 :])
        elif kwargs.get(name) is not None:
            kwargs[name] = OFF[name]
    return checkpoint(forward, self, *args, use_reentrant=False, **kwargs)


def cache_args(module: nn.Module) -> tuple[tuple[str, int], ...]:
    """(name, position after ``self``) of the cache arguments ``module``'s forward takes."""
    try:
        params = list(inspect.signature(type(module).forward).parameters)[1:]
    except (TypeError, ValueError):  # a forward without a signature: no cache to look for
        return ()
    return tuple((name, i) for i, name in enumerate(params) if name in OFF)


def apply_activation_checkpointing(
    model: nn.Module, names: list[str], classes: dict[str, str] | None = None
) -> list[str]:
    """Recompute the forward of each module of a class in ``names``, in place; the qualified
    names of those modules. A module inside another recomputed one is left as it is (the outer
    recomputation already covers it; nesting would recompute it twice). ``classes``: each
    module's class by name where its type is not it (a traced pipeline stage's modules stand in
    for the model's: parallel/traced_stages.py)."""
    wanted, warned, classes = set(names), False, classes or {}
    done: list[str] = []
    for qualified, module in model.named_modules():
        if classes.get(qualified, type(module).__name__) not in wanted or is_recomputed(module):
            continue
        if any(qualified.startswith(f"{outer}.") for outer in done):
            continue
        module._recompute_cache_args = cache_args(module)
        if any(name in CACHE_ARGS for name, _ in module._recompute_cache_args) and not warned:
            warned = True
            logging.getLogger(LOGGER_NAME).info(
                "strategy.activation_checkpointing: %s trains without its key/value cache "
                "(recomputing its forward would fill the cache twice)",
                classes.get(qualified, type(module).__name__),
            )
        module.forward = types.MethodType(_recomputed_forward, module)
        done.append(qualified)
    return done


def is_recomputed(module: nn.Module) -> bool:
    """Whether ``module``'s forward is recomputed in backward (set by this module)."""
    forward = vars(module).get("forward")
    return getattr(forward, "__func__", None) is _recomputed_forward
