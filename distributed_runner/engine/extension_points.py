"""The declared ways, besides the mount points, in which a hook plugs into the loop.

A hook takes part by subclassing one of these classes (next to :class:`~hooks.Hook`); the
dispatcher finds them at registration, the loop and the Runner call them, and ``drun hooks``
lists them under "Extension points". Nothing is found by duck typing: a method that merely has one
of these names on a hook that does not subclass the class is never called.

==================  ==========================================================================
StepGuard           between forward and backward, on every iteration: may reject the step
                    (skip it on every rank, or roll every rank back to the newest checkpoint)
CheckpointSaver     saves the checkpoints the loop is asked for (``runner.request_checkpoint``,
                    preemption), so retention and the ``last_checkpoint`` pointer stay its job
SinkProvider        names log sinks (``sink_specs``); the Runner builds them once and serves
                    them to every hook as ``runner.sinks``
RankFigures         keeps figures on each rank that matter side by side, not averaged; LoggerHook
                    gathers them in the collective it makes at each training record anyway
==================  ==========================================================================

Unlike the mount points, these methods are called *outside* the dispatcher: they are not in
``runner.hook_timings()`` and the hook's ``on_error`` does not apply — a failure propagates, by
design. A StepGuard's ``check_loss``/``reject_step`` return verdicts the step acts on, combined
over ranks (skipping a guard that failed on one rank would split the ranks), and ``on_rollback``
completes a rollback every rank does; the loop's step calls them. ``save_on_request`` writes a
requested or preemption checkpoint on every rank (``Runner.save_requested_checkpoint``): it is
written or training stops, loudly. ``sink_specs`` is read once, when the Runner is built. The same
holds for a hook's ``state_dict``/``load_state_dict``, which the checkpoint code calls (a
checkpoint missing a hook's state would resume wrongly). ``rank_figures``/``figures_gathered`` are
LoggerHook's to call, on every rank at every training record of a distributed run: its collective
needs every rank's figures, so none may be skipped on one rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


class StepGuard:
    """Consulted by the training loop between the forward pass and backward.

    Every guard's :meth:`check_loss` verdict is combined over ranks (one all-reduce MIN when
    distributed), so all ranks take the same branch. When any rank says no, the loop calls
    :meth:`reject_step` on every rank, which returns ``'skip'`` (no backward and no step on any
    rank; the iteration still counts) or ``'rollback'`` (every rank restores the newest checkpoint,
    then :meth:`on_rollback` runs), or raises to end training.
    """

    def check_loss(self, loss: torch.Tensor) -> bool:
        """Whether this step may go ahead (called on every rank, every iteration)."""
        raise NotImplementedError

    def reject_step(self, runner: RunnerAPI, loss: torch.Tensor) -> str:
        """What to do with a step some rank rejected: ``'skip'`` or ``'rollback'`` (or raise)."""
        raise NotImplementedError

    def on_rollback(self, runner: RunnerAPI) -> None:
        """After the rollback restored the newest checkpoint (e.g. scale the learning rate)."""


class CheckpointSaver:
    """Saves the checkpoints the loop is asked for between iterations.

    ``runner.request_checkpoint(reason)`` and preemption end in
    ``runner.save_requested_checkpoint(reason)``, which calls the first registered saver (in call
    order); with none registered the Runner writes ``work_dir/iter_{N}.pth`` itself.
    """

    def save_on_request(self, runner: RunnerAPI, reason: str) -> Path:
        """Save the current state now (on every rank; rank 0 writes) and return its path."""
        raise NotImplementedError


class SinkProvider:
    """Names the log sinks of the run in ``sink_specs`` (names, ``dict(type=...)`` or
    :class:`~distributed_runner.tracking.sinks.LogSink` objects).

    The Runner validates and builds them once, when it is built (the Ray driver validates them
    before any worker starts), opens them around every ``train()``/``val()``/``test()`` and serves
    them to every hook as ``runner.sinks``. LoggerHook is the built-in provider; its ``sinks=``
    argument is where a config names them.
    """

    sink_specs: Sequence[Any] = ()


class RankFigures:
    """Keeps, on each rank, figures worth seeing rank by rank rather than averaged (which rank
    is slow: :class:`~hooks.StragglerHook`).

    In a distributed run LoggerHook, at each training record, takes every provider's
    :meth:`rank_figures` into the one collective it makes there anyway (an all_gather of its
    window's values and these figures), then calls
    :meth:`figures_gathered` on every rank with the same table and writes the scalars it returns
    into the record. No synchronisation of its own, and none outside LoggerHook's records.
    """

    def rank_figures(self) -> Sequence[float]:
        """This rank's figures for the window since the previous record. The same number on
        every rank at every record (an all_gather needs equal shapes); none in a single process."""
        return ()

    def figures_gathered(self, runner: RunnerAPI, per_rank: list[list[float]]) -> dict[str, float]:
        """``per_rank[r]``: rank ``r``'s :meth:`rank_figures`. Returns scalars for the training
        record (names as logged, without ``train/``); the same table on every rank, so every
        rank may decide alike and rank 0 log."""
        return {}


EXTENSION_POINTS: dict[str, type] = {
    "step guard": StepGuard,
    "checkpoint on request": CheckpointSaver,
    "log sinks": SinkProvider,
    "rank figures": RankFigures,
}
