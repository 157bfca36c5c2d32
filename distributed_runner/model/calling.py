"""How the loop calls a model and reads its losses, in training and evaluation alike.

How a batch reaches the model, in training and evaluation alike: its tensors are moved to the
device; a dict batch is passed as keyword arguments, a tuple or list as positional ones, anything
else as the one argument, with ``mode`` ('loss' to train, 'predict' to evaluate) for a model
written MMEngine's way (``forward`` takes ``mode``, or a BaseModel). A model taken as it is (a
Hugging Face or timm model, any ``forward`` without ``mode``) is called without it
(:func:`call_as_is`), and :class:`LossOf` finds the loss in what it returns. Which of the two is
decided once per run (:func:`distributed_runner.engine.step_choice.choose_step`), which hands the
steps a ``call``/``parse`` pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from distributed_runner.core.errors import ConfigError


def move_to(data: Any, device: torch.device) -> Any:
    """Tensors in ``data`` (dicts, lists, tuples) moved to ``device``."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, dict):
        return {k: move_to(v, device) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(move_to(v, device) for v in data)
    return data


def call_model(model: Any, data: Any, mode: str) -> Any:
    """``model`` called with ``data`` as the module docstring says (keyword arguments for a dict
    batch, positional ones for a tuple/list)."""
    if isinstance(data, dict):
        return model(**data, mode=mode)
    if isinstance(data, (list, tuple)):
        return model(*data, mode=mode)
    return model(data, mode=mode)


def call_for_loss(model: Any, data: Any) -> Any:
    """A model written MMEngine's way, called to train: ``mode='loss'``."""
    return call_model(model, data, "loss")


def call_as_is(model: Any, data: Any) -> Any:
    """A model taken as it is (no ``mode`` in its forward): ``forward(**batch)`` for a dict
    batch, ``forward(*batch)`` for a tuple/list, ``forward(batch)`` otherwise."""
    if isinstance(data, dict):
        return model(**data)
    if isinstance(data, (list, tuple)):
        return model(*data)
    return model(data)


class LossOf:
    """``parse`` for a model taken as it is: what its forward returned -> (the loss, the values
    to log). The loss is a returned 0-dim tensor, a returned mapping's ``loss`` entry (else the
    sum of its entries whose key contains ``loss``, MMEngine's rule), or a returned object's
    ``.loss`` (Hugging Face's ``ModelOutput``, a mapping too). Every other 0-dim tensor in a
    mapping is logged (``aux_loss`` ...): never logits or caches, which are not values to log.
    ``owner`` (``GPT2LMHeadModel``) names the model in the error for a forward with no loss."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def __call__(self, outputs: Any) -> tuple[torch.Tensor, dict]:
        if isinstance(outputs, torch.Tensor):
            return self._checked(outputs, type(outputs).__name__), {"loss": outputs.detach()}
        loss = getattr(outputs, "loss", None)
        log_vars: dict[str, Any] = {}
        if isinstance(outputs, Mapping):
            summed = loss is None and "loss" not in outputs
            for key, value in outputs.items():
                if summed and "loss" in key and torch.is_tensor(value):
                    loss = value.mean() if loss is None else loss + value.mean()
                elif key == "loss" and loss is None:
                    loss = value
                if torch.is_tensor(value) and not value.dim() and key != "loss":
                    log_vars[key] = value.detach()
        loss = self._checked(loss, self._what_is_missing(outputs))
        return loss, {"loss": loss.detach(), **log_vars}

    def _what_is_missing(self, outputs: Any) -> str:
        kind = type(outputs).__name__
        if hasattr(outputs, "loss"):
            return f"{kind}.loss is None"
        if isinstance(outputs, Mapping):
            return f"{kind} with no 'loss' entry; keys: {', '.join(map(str, outputs)) or 'none'}"
        return f"a {kind}, not a loss tensor, a mapping with 'loss' or an object with .loss"

    def _checked(self, loss: Any, what: str) -> torch.Tensor:
        """``loss`` if it is a 0-dim tensor; else the one-line error naming the model."""
        if torch.is_tensor(loss) and not loss.dim():
            return loss
        if torch.is_tensor(loss):
            what = f"a tensor of shape {list(loss.shape)}, not a 0-dim loss"
        raise ConfigError(
            "model",
            f"{self.owner}.forward returned no loss ({what}): put the "
            f"targets in the batch (labels=...), or give the model a "
            f"forward(..., mode) that returns dict(loss=...)",
        )


def parse_losses(losses: dict) -> tuple[torch.Tensor, dict]:
    """The sum of every entry whose key contains ``loss``, and all entries detached for logging."""
    if len(losses) == 1 and type(losses) is dict:  # the common case, {'loss': 0-dim tensor}
        value = losses.get("loss")
        if type(value) is torch.Tensor and not value.dim():
            return value, {"loss": value.detach()}
    if not isinstance(losses, dict):
        raise TypeError(
            f"forward(mode='loss') must return a dict of tensors, got {type(losses).__name__}"
        )
    log_vars: dict[str, Any] = {}
    total = None
    n_losses = 0
    for key, given in losses.items():
        if isinstance(given, (list, tuple)):
            value = sum(v.mean() for v in given)
        elif given.dim():
            value = given.mean()
        else:
            value = given
        log_vars[key] = value.detach()
        if "loss" in key:
            total = value if total is None else total + value
            n_losses += 1
    if total is None:
        raise ValueError(
            f"forward(mode='loss') returned no key containing 'loss' (keys: {', '.join(losses)})"
        )
    if n_losses == 1 and "loss" in log_vars:  # the common case: log_vars['loss'] is the total
        return total, log_vars
    return total, {"loss": total.detach(), **log_vars}
