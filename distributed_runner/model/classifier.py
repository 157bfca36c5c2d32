"""Classifier: trains a backbone that only predicts, MMEngine's way (``forward(..., mode)``).

A timm model, a Hugging Face image classifier or any ``nn.Module`` returns class scores and
knows nothing of labels or losses; this wrapper adds them::

    model = dict(type='Classifier',
                 backbone=dict(type='timm.create_model', model_name='resnet18', num_classes=10,
                               pretrained=False),
                 loss=dict(type='CrossEntropyLoss'))

``mode='loss'`` returns ``{'loss': ...}``; ``'predict'`` and ``'tensor'`` the logits, which
:class:`~distributed_runner.evaluation.evaluator.Accuracy` takes as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from distributed_runner.core.errors import ArgumentError, argument_errors
from distributed_runner.core.registry import MODELS

_MODES = ("loss", "predict", "tensor")


def logits_of(outputs: Any, key: str = "logits") -> torch.Tensor:
    """The class scores in what a backbone returned: the tensor itself, a mapping's ``key``
    entry, or an object's ``.key`` attribute (Hugging Face's ``ModelOutput``: both)."""
    if torch.is_tensor(outputs):
        return outputs
    if isinstance(outputs, Mapping) and key in outputs:
        return outputs[key]
    value = getattr(outputs, key, None)
    if torch.is_tensor(value):
        return value
    if isinstance(outputs, (tuple, list)) and outputs and torch.is_tensor(outputs[0]):
        return outputs[0]  # return_dict=False: the logits come first
    raise TypeError(
        f"the backbone returned {type(outputs).__name__}, not logits, a mapping "
        f"with {key!r} or an object with .{key}"
    )


@MODELS.register_module()
class Classifier(nn.Module):
    """A ``backbone`` (a ``MODELS`` config, dotted import paths included, or a module) and a
    ``loss`` (a ``MODELS`` config: ``torch.nn``'s losses by name; a module or a callable
    ``loss(logits, labels)``).

    Batches: a dict with ``inputs_key`` (default ``'inputs'``) and ``labels_key`` (``'labels'``)
    — the other entries are not the backbone's business and are ignored — or an
    ``(inputs, labels)`` tuple. ``logits_key``: where a returned mapping or object keeps the
    scores (``'logits'``, Hugging Face's name).
    """

    def __init__(
        self,
        backbone: dict | nn.Module,
        loss: dict | nn.Module | Callable | None = None,
        inputs_key: str = "inputs",
        labels_key: str = "labels",
        logits_key: str = "logits",
    ) -> None:
        super().__init__()
        if isinstance(backbone, dict):  # errors keyed where this model sits in the config
            with argument_errors():
                backbone = MODELS.build(backbone, "backbone")
        if not isinstance(backbone, nn.Module):
            raise ArgumentError(
                "backbone",
                f"expected a model config dict(type=...) or an "
                f"nn.Module, got {type(backbone).__name__}",
            )
        self.backbone = backbone
        loss = {"type": "CrossEntropyLoss"} if loss is None else loss
        if isinstance(loss, dict):
            with argument_errors():
                loss = MODELS.build(loss, "loss")
        if not callable(loss):
            raise ArgumentError(
                "loss",
                f"expected a loss config dict(type=...), a module or a "
                f"callable, got {type(loss).__name__}",
            )
        self.loss_fn = loss
        self.inputs_key, self.labels_key, self.logits_key = inputs_key, labels_key, logits_key

    def forward(self, *args: Any, mode: str = "tensor", **batch: Any) -> Any:
        """``forward(inputs, labels, mode=...)`` for tuple batches, ``forward(**batch,
        mode=...)`` for dict batches, as the loops call it."""
        inputs, labels = self._split(args, batch)
        if mode not in _MODES:
            raise ValueError(f"Classifier.forward: mode must be one of {_MODES}, got {mode!r}")
        logits = logits_of(self.backbone(inputs), self.logits_key)
        if mode != "loss":
            return logits
        if labels is None:
            raise ValueError(
                f"Classifier.forward(mode='loss') needs labels: a "
                f"{self.labels_key!r} entry in the batch (model.labels_key)"
            )
        return {"loss": self.loss_fn(logits, labels)}

    def _split(self, args: tuple, batch: dict) -> tuple[Any, Any | None]:
        """(inputs, labels) from positional or keyword batch entries."""
        if args:
            return args[0], (args[1] if len(args) > 1 else batch.get(self.labels_key))
        if self.inputs_key not in batch:
            raise KeyError(
                f"Classifier: the batch has no {self.inputs_key!r} (model.inputs_key); "
                f"its keys: {', '.join(batch) or 'none'}"
            )
        return batch[self.inputs_key], batch.get(self.labels_key)
