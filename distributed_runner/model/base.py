"""MMEngine's model base classes (``mmengine.model``): ``BaseModel`` and ``BaseDataPreprocessor``.

A model written for MMEngine — ``forward(inputs, data_samples, mode)``, a ``data_preprocessor``,
perhaps its own ``train_step(data, optim_wrapper)`` / ``val_step`` / ``test_step`` — runs here
after ``from mmengine.model import BaseModel`` becomes ``from distributed_runner.model.base import
BaseModel``. How the loops call such a model is :mod:`distributed_runner.engine.step_choice`.

A plain ``nn.Module`` with ``forward(..., mode)`` needs none of this
(:mod:`distributed_runner.model.calling`: how it is called).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from distributed_runner.core.registry import MODELS
from distributed_runner.model.build import get_ori_model, is_model_wrapper
from distributed_runner.model.calling import call_model, move_to, parse_losses

__all__ = ["BaseDataPreprocessor", "BaseModel", "get_ori_model", "is_model_wrapper"]


@MODELS.register_module()
class BaseDataPreprocessor(nn.Module):
    """Moves a batch's tensors to the model's device, as MMEngine's default preprocessor does.

    Subclasses override ``forward(data, training=False)`` to normalise, pad or augment on the
    device; ``training`` says whether the batch is for a training step. The device follows the
    model's ``.to()`` / ``.cuda()`` / ``.cpu()`` (this module has no parameters to tell it).
    """

    def __init__(self, non_blocking: bool = False) -> None:
        super().__init__()
        self._non_blocking = non_blocking
        self._device = torch.device("cpu")

    @property
    def device(self) -> torch.device:
        return self._device

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> BaseDataPreprocessor:
        # every .to()/.cuda()/.cpu() of a parent reaches children through _apply: learn the
        # device from what fn does to an empty tensor on the current one
        self._device = fn(torch.empty(0, device=self._device)).device
        return super()._apply(fn, *args, **kwargs)

    def cast_data(self, data: Any) -> Any:
        """``data``'s tensors (in dicts, lists, tuples) on this preprocessor's device."""
        return move_to(data, self._device)

    def forward(self, data: Any, training: bool = False) -> Any:
        return self.cast_data(data)


class BaseModel(nn.Module):
    """MMEngine's ``BaseModel``: a ``data_preprocessor`` (a module or a ``MODELS`` config;
    default :class:`BaseDataPreprocessor`), ``forward(inputs, data_samples=None, mode=...)`` for
    ``'loss'`` / ``'predict'`` / ``'tensor'``, and the three steps MMEngine's loops call.

    The Runner calls ``train_step`` only when a subclass overrides it; otherwise it runs the same
    sequence itself (preprocess, forward through DDP/FSDP, ``parse_losses``, update) so the
    gradients are synchronised by the wrapper, as MMEngine's ``MMDistributedDataParallel`` does.
    """

    def __init__(
        self, data_preprocessor: dict | nn.Module | None = None, init_cfg: dict | None = None
    ) -> None:
        super().__init__()
        if data_preprocessor is None:
            data_preprocessor = BaseDataPreprocessor()
        if isinstance(data_preprocessor, dict):
            data_preprocessor = MODELS.build(data_preprocessor, "model.data_preprocessor")
        if not isinstance(data_preprocessor, nn.Module):
            raise TypeError(
                f"data_preprocessor must be an nn.Module or a config dict, got "
                f"{type(data_preprocessor).__name__}"
            )
        self.data_preprocessor = data_preprocessor
        self.init_cfg = init_cfg

    def train_step(self, data: Any, optim_wrapper: Any) -> dict:
        """Preprocess, forward in ``'loss'`` mode, parse the losses, update; returns log_vars."""
        with optim_wrapper.optim_context(self):
            data = self.data_preprocessor(data, True)
            losses = self._run_forward(data, mode="loss")
        loss, log_vars = self.parse_losses(losses)
        optim_wrapper.update_params(loss)
        return log_vars

    def val_step(self, data: Any) -> Any:
        return self._run_forward(self.data_preprocessor(data, False), mode="predict")

    def test_step(self, data: Any) -> Any:
        return self._run_forward(self.data_preprocessor(data, False), mode="predict")

    def parse_losses(self, losses: dict) -> tuple[torch.Tensor, dict]:
        """The sum of the entries whose key contains ``loss`` (a list is summed after each
        mean), and every entry for logging, ``loss`` (the total) included."""
        return parse_losses(losses)

    def _run_forward(self, data: Any, mode: str) -> Any:
        return call_model(self, data, mode)

    def forward(self, inputs: Any, data_samples: Any = None, mode: str = "tensor") -> Any:
        raise NotImplementedError(
            f"{type(self).__name__}.forward(inputs, data_samples, mode) "
            f"must be implemented (MMEngine's BaseModel contract)"
        )
