"""Weight averages EMAHook keeps: exponential, momentum-annealed exponential, stochastic (SWA).

An averaged model is a frozen copy of the training model whose floating-point parameters (and
buffers, with ``update_buffers=True``) follow the source after every ``interval``-th update:

* ``ExponentialMovingAverage(momentum=0.0002)``: ``avg = (1 - momentum) * avg + momentum * src``
  (MMEngine's convention: ``momentum`` is the weight of the *new* value);
* ``MomentumAnnealingEMA(momentum=0.0002, gamma=100)``: the same with
  ``max(momentum, gamma / (gamma + steps))``, so early averages follow the source closely;
* ``StochasticWeightAverage``: the equal-weight mean of every averaged snapshot.

Without ``update_buffers`` the buffers (BatchNorm statistics) are copied from the source, which
is what the averaged weights are evaluated with. All three are registered in ``MODELS``; a
custom average subclasses :class:`BaseAveragedModel` and implements ``avg_func``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import MODELS
from distributed_runner.model.sharding import ShardedCopy, is_sharded
from distributed_runner.parallel.pipeline import gathered_tensors


class BaseAveragedModel:
    """A frozen copy of ``model`` and the update rule; ``state_dict`` holds weights and steps."""

    def __init__(
        self, model: nn.Module, interval: int = 1, device: Any = None, update_buffers: bool = False
    ) -> None:
        sharded = _holds_shards(model)
        if device is not None and sharded:
            raise ConfigError(
                "device",
                "an FSDP-sharded model's average stays on its shards' "
                "device: leave the averaged model's device unset",
            )
        # an FSDP-sharded model cannot be deep-copied: its shards are copied instead
        self.module: nn.Module | ShardedCopy
        if sharded:
            self.module = ShardedCopy(model)
        else:
            self.module = copy.deepcopy(model).requires_grad_(False)
            if device is not None:  # (refused above for a sharded model)
                self.module.to(device)
        self.interval = int(interval)
        self.update_buffers = bool(update_buffers)
        self.steps = 0
        self._averaged = self._tensors(self.module, averaged_only=True)
        self._copied = self._tensors(self.module, averaged_only=False)

    def _tensors(
        self, module: nn.Module | ShardedCopy, averaged_only: bool
    ) -> dict[str, torch.Tensor]:
        """The tensors that are averaged (``averaged_only``) or copied from the source."""
        params = dict(module.named_parameters())
        buffers = dict(module.named_buffers())
        averaged = {
            k: v
            for k, v in {**params, **(buffers if self.update_buffers else {})}.items()
            if v.is_floating_point()
        }
        if averaged_only:
            return averaged
        return {k: v for k, v in {**params, **buffers}.items() if k not in averaged}

    def avg_func(self, averaged: torch.Tensor, source: torch.Tensor, steps: int) -> None:
        raise NotImplementedError

    @torch.no_grad()
    def update_parameters(self, model: nn.Module) -> None:
        """Fold the source's current weights into the average (first call: copy them)."""
        source = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        if self.steps == 0:
            for name, tensor in self._averaged.items():
                tensor.copy_(source[name])
        elif self.steps % self.interval == 0:
            for name, tensor in self._averaged.items():
                self.avg_func(tensor, source[name].detach(), self.steps)
        for name, tensor in self._copied.items():
            tensor.copy_(source[name])
        self.steps += 1

    @torch.no_grad()
    def copy_from(self, model: nn.Module) -> None:
        """Track the source exactly (before averaging begins)."""
        source = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        for name, tensor in {**self._averaged, **self._copied}.items():
            tensor.copy_(source[name])

    def swap_pairs(self, model: nn.Module) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(source tensor, averaged tensor) pairs that evaluation swaps."""
        source = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        return [(source[name], tensor) for name, tensor in self._averaged.items()]

    def state_dict(self) -> dict:
        """The steps and the averaged weights; under pipeline parallelism every stage's,
        gathered on the first rank (a collective: checkpoints run it on every rank)."""
        weights = {f"module.{k}": v for k, v in self.module.state_dict().items()}
        if dist.get_pipeline_size() > 1:
            weights = gathered_tensors(weights)
        return {"steps": torch.tensor(self.steps), **weights}

    def load_state_dict(self, state: dict, strict: bool = True) -> list[str]:
        """Load; returns the missing/unexpected keys (raises on them when ``strict``). Under
        pipeline parallelism the whole model's average gives this rank's stages theirs."""
        weights = {k[len("module.") :]: v for k, v in state.items() if k.startswith("module.")}
        self.steps = int(state.get("steps", 0))
        if dist.get_pipeline_size() > 1:  # the other stages' are not this rank's to take
            own = {n for n, _ in self.module.named_parameters()}
            own |= {n for n, _ in self.module.named_buffers()}
            weights = {k: v for k, v in weights.items() if k in own}
        result = self.module.load_state_dict(weights, strict=strict)
        return list(result.missing_keys) + list(result.unexpected_keys)


def _holds_shards(model: nn.Module) -> bool:
    """Whether ``model`` is FSDP-sharded, or holds sharded modules (a pipeline stage's, whose
    stage module is FSDP's root): either way it cannot be deep-copied."""
    return is_sharded(model) or any(is_sharded(m) for m in model.modules())


@MODELS.register_module()
class ExponentialMovingAverage(BaseAveragedModel):
    def __init__(
        self,
        model: nn.Module,
        momentum: float = 0.0002,
        interval: int = 1,
        device: Any = None,
        update_buffers: bool = False,
    ) -> None:
        if not 0.0 < momentum < 1.0:
            raise ValueError(f"momentum must be in (0, 1), got {momentum}")
        super().__init__(model, interval, device, update_buffers)
        self.momentum = float(momentum)

    def avg_func(self, averaged: torch.Tensor, source: torch.Tensor, steps: int) -> None:
        averaged.lerp_(source, self.momentum)


@MODELS.register_module()
class MomentumAnnealingEMA(ExponentialMovingAverage):
    def __init__(
        self,
        model: nn.Module,
        momentum: float = 0.0002,
        gamma: int = 100,
        interval: int = 1,
        device: Any = None,
        update_buffers: bool = False,
    ) -> None:
        super().__init__(model, momentum, interval, device, update_buffers)
        if gamma <= 0:
            raise ValueError(f"gamma must be > 0, got {gamma}")
        self.gamma = int(gamma)

    def avg_func(self, averaged: torch.Tensor, source: torch.Tensor, steps: int) -> None:
        averaged.lerp_(source, max(self.momentum, self.gamma / (self.gamma + steps)))


@MODELS.register_module()
class StochasticWeightAverage(BaseAveragedModel):
    def avg_func(self, averaged: torch.Tensor, source: torch.Tensor, steps: int) -> None:
        averaged.add_(source - averaged, alpha=1.0 / (steps // self.interval + 1))
