"""Test-time augmentation: predict on augmented views of each batch and merge the predictions.

``TTAModel(module, transforms=[...], merge='mean')`` wraps the model the test loop calls. In
``mode='predict'`` it runs the wrapped model once per transform — each transform maps the batch's
positional and keyword inputs to an augmented view — and merges the outputs:

* ``'mean'``: the mean of the outputs (tensors; dicts/lists/tuples of tensors element-wise);
* ``'softmax_mean'``: the mean of ``softmax(dim=-1)`` of them — for logits of classifiers;
* ``'vote'``: the most frequent ``argmax(-1)`` per sample, returned as one-hot scores.

Transforms are registered in ``TRANSFORMS``: ``Identity`` and ``Flip(dims=(-1,), key='inputs',
index=0)`` (flips the keyword input ``key`` or, for tuple batches, the positional ``index``).
A transform is any callable ``(args, kwargs) -> (args, kwargs)``. Other modes (``'loss'``) pass
straight through, so a TTA model never changes training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import MODELS, TRANSFORMS

MERGES = ("mean", "softmax_mean", "vote")


@TRANSFORMS.register_module()
class Identity:
    """The original view."""

    def __call__(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, kwargs


@TRANSFORMS.register_module()
class Flip:
    """Flip one input tensor along ``dims`` (``(-1,)``: horizontal for ``N, C, H, W`` images)."""

    def __init__(self, dims: Sequence[int] = (-1,), key: str = "inputs", index: int = 0) -> None:
        self.dims, self.key, self.index = tuple(dims), key, int(index)

    def __call__(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if self.key in kwargs:
            return args, {**kwargs, self.key: torch.flip(kwargs[self.key], self.dims)}
        if len(args) > self.index:
            flipped = list(args)
            flipped[self.index] = torch.flip(args[self.index], self.dims)
            return tuple(flipped), kwargs
        raise KeyError(
            f"Flip: the batch has no input {self.key!r} nor positional input {self.index}"
        )


def _merge(outputs: list, how: str) -> Any:
    first = outputs[0]
    if isinstance(first, dict):
        return {k: _merge([o[k] for o in outputs], how) for k in first}
    if isinstance(first, (list, tuple)):
        return type(first)(_merge(list(parts), how) for parts in zip(*outputs, strict=True))
    if not torch.is_tensor(first) or not first.is_floating_point():
        return first  # ids, labels: the same in every view
    stacked = torch.stack(outputs)
    if how == "mean":
        return stacked.mean(0)
    if how == "softmax_mean":
        return stacked.softmax(-1).mean(0)
    votes = torch.nn.functional.one_hot(stacked.argmax(-1), stacked.shape[-1]).sum(0)
    return votes.to(first.dtype)


@MODELS.register_module()
class TTAModel(nn.Module):
    """The wrapper described in the module docstring; ``module`` is the model to wrap."""

    is_model_wrapper = True  # the user's model is .module (MMEngine registers it a wrapper)

    def __init__(
        self, module: nn.Module, transforms: Sequence[Any] = ("Identity",), merge: str = "mean"
    ) -> None:
        super().__init__()
        if merge not in MERGES:
            raise ConfigError(
                "tta_cfg.merge", f"unknown merge {merge!r}: use {', '.join(map(repr, MERGES))}"
            )
        if not transforms:
            raise ConfigError(
                "tta_cfg.transforms",
                "give at least one transform, e.g. ['Identity', dict(type='Flip')]",
            )
        self.module = module
        self.merge = merge
        self.transforms: list[Callable] = [
            TRANSFORMS.build({"type": t} if isinstance(t, str) else t, f"tta_cfg.transforms[{i}]")
            for i, t in enumerate(transforms)
        ]

    def forward(self, *args: Any, mode: str = "predict", **kwargs: Any) -> Any:
        if mode != "predict":
            return self.module(*args, mode=mode, **kwargs)
        outputs = []
        for transform in self.transforms:
            view_args, view_kwargs = transform(args, kwargs)
            outputs.append(self.module(*view_args, mode=mode, **view_kwargs))
        return _merge(outputs, self.merge)
