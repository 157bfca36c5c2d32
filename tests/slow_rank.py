"""A test-only hook that makes one rank slow before the step's collective, for StragglerHook's
tests (in ``mp.spawn`` workers, and on Ray workers through ``custom_imports``)."""
from __future__ import annotations

import time

import tests.toy  # noqa: F401  (registers ToyDataset / ToyModel on a worker)
from distributed_runner.core.registry import HOOKS
from hooks import Hook


@HOOKS.register_module(force=True)
class SlowRankHook(Hook):
    """Sleeps ``base`` seconds before every training step on every rank, and ``factor`` times
    that on ``rank`` while ``from_iter <= runner.iter < until_iter`` (None: to the end): the slow
    rank reaches the gradient all-reduce later, as one with a slow data loader or a throttled GPU
    would."""

    def __init__(self, rank: int = 1, base: float = 0.02, factor: float = 3.0,
                 until_iter: int | None = None, from_iter: int = 0) -> None:
        self.rank, self.base, self.factor, self.until_iter = rank, base, factor, until_iter
        self.from_iter = from_iter

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        slow = runner.rank == self.rank and self.from_iter <= runner.iter and (
            self.until_iter is None or runner.iter < self.until_iter)
        time.sleep(self.base * (self.factor if slow else 1.0))
