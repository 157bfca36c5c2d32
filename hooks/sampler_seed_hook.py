"""DistSamplerSeedHook: a new shuffle every epoch, the same on every rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class DistSamplerSeedHook(Hook):
    """Call ``set_epoch(runner.epoch)`` on the training sampler (and batch sampler's sampler).

    Samplers seed their permutation with ``seed + epoch``; without this every epoch would repeat
    the first one's order. Every rank calls it with the same epoch, so the ranks' shards of an
    epoch stay disjoint. Ranks: all.
    """

    priority = "NORMAL"

    def before_train_epoch(self, runner: RunnerAPI) -> None:
        loader = runner.train_dataloader
        for sampler in (
            getattr(loader, "sampler", None),
            getattr(getattr(loader, "batch_sampler", None), "sampler", None),
        ):
            if sampler is not None and hasattr(sampler, "set_epoch"):
                sampler.set_epoch(runner.epoch)
