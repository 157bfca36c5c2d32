"""StragglerHook: names the rank every other rank waits for.

Why not step time: every rank leaves the step's gradient all-reduce at the same moment, so a rank
made three times slower shows the same per-rank step time as the others (measured: a spread of
1.01x). What differs is how long each rank takes to *reach* the collective — waiting for its
batch, the hooks before the step, its forward pass — while the others sit in the all-reduce
(measured: 3.00x for the rank made 3x slower). That is the figure kept here, per optimizer step.

How it is measured, at no cost to a single process (nothing is attached there):

* a forward hook on ``runner.wrapped_model`` notes the end of each training forward pass (under
  FSDP, whose forward begins with a parameter all-gather, a forward *pre*-hook notes its start);
* a step post-hook on the optimizer notes the end of each optimizer step, where the next
  step's time starts;
* each rank adds its own seconds (forward end minus the previous step's end) with no
  synchronisation. Validation and checkpoint saves are left out: the clock pauses at
  ``before_val`` and ``after_save_checkpoint`` (other hooks still run there after this one:
  RayReportHook's upload) and the first step after a pause is not measured; each epoch starts
  it again. DDP rebuilds its gradient buckets in the second iteration's forward, a collective:
  the first record's figures are less sharp, which ``straggler_patience`` absorbs.

The figures cross ranks only at LoggerHook's training records, in the collective it makes there
anyway: this hook is a :class:`~distributed_runner.engine.extension_points.RankFigures` provider, so
LoggerHook gathers every rank's figures with its window's values (in its one all_gather, no
collective of its own) and puts ``straggler/rank_<r>_s`` (rank r's mean seconds before the
collective per step), ``straggler/spread`` and ``straggler/slowest_rank`` in the record, hence in
every sink. A rank at ``watchdog.straggler_ratio`` times the median of the other ranks' figures (and
at least :data:`MIN_EXCESS_S` above it) for ``watchdog.straggler_patience`` records in a row is
named in one warning, and in one more when it recovers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any

import torch

from distributed_runner.core import dist
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.extension_points import RankFigures
from distributed_runner.engine.hook import Hook

if TYPE_CHECKING:
    from torch import nn
    from torch.optim import Optimizer

    from distributed_runner.core.runner_api import RunnerAPI

MIN_EXCESS_S = 0.001
"""A rank is a straggler only if it is also this many seconds per step above the others'
median: below a millisecond the ratio of two tiny figures is scheduling noise, and costs nothing."""


class PreCollectiveClock:
    """This rank's seconds before the step's collective, summed since the last :meth:`take`.

    Only torch's own hooks, no mount point: a forward hook on the model the loop calls (its
    end, or with ``at_forward_start`` its start) and a step post-hook on the optimizer. A
    step's time runs from the previous optimizer step's end (or :meth:`restart`) to the last
    forward before its backward; several forwards (micro-batches) chain. After :meth:`pause`
    forwards are not timed, and the step they belong to is not counted.
    """

    __slots__ = ("_handles", "forwards", "seconds", "start", "steps", "unmeasured")

    def __init__(self) -> None:
        self.seconds, self.steps, self.forwards = 0.0, 0, 0
        self.start: float | None = None  # None: paused
        self.unmeasured = False  # a forward ran while paused: its step is not counted
        self._handles: list[Any] = []

    def attach(self, model: nn.Module, optimizer: Optimizer, at_forward_start: bool) -> None:
        if at_forward_start:  # before FSDP's own pre-forward hook, which all-gathers
            forward = model.register_forward_pre_hook(self._forward_mark, prepend=True)
        else:
            forward = model.register_forward_hook(self._forward_mark)
        self._handles = [forward, optimizer.register_step_post_hook(self._step_done)]
        self.restart()

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    def restart(self) -> None:
        self.start, self.unmeasured = perf_counter(), False

    def pause(self) -> None:
        """Until the next optimizer step ends (or :meth:`restart`)."""
        self.start = None

    def _forward_mark(self, *_: Any) -> None:
        start = self.start
        if start is None:
            self.unmeasured = True
            return
        now = perf_counter()
        self.seconds += now - start
        self.forwards += 1
        self.start = now

    def _step_done(self, *_: Any) -> None:
        if self.unmeasured:
            self.unmeasured = False
        else:
            self.steps += 1
        self.start = perf_counter()

    def take(self) -> tuple[float, int]:
        """(seconds per step since the last take, NaN when no forward was timed; steps)."""
        seconds, steps, forwards = self.seconds, self.steps, self.forwards
        self.seconds, self.steps, self.forwards = 0.0, 0, 0
        return (seconds / steps if steps and forwards else math.nan), steps


@dataclass(frozen=True)
class StragglerEvent:
    """A rank named (``kind='straggler'``) or no longer slow (``'recovered'``) at a record."""

    kind: str
    rank: int
    ratio: float  # its figure over the median of the other ranks'
    seconds: float  # its seconds before the collective per step
    median: float  # the other ranks' median
    windows: int  # records in a row it has been slow


def median_without(ordered: Sequence[float], i: int) -> float:
    """The median of sorted ``ordered`` without its ``i``-th element (len >= 2)."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k if k < i else k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


class StragglerWatch:
    """The decision, kept apart from timing and collectives (so it is tested on its own):
    which rank is slow in a window, and when that becomes an episode worth a line."""

    def __init__(self, ratio: float, patience: int, min_excess: float = MIN_EXCESS_S) -> None:
        self.ratio, self.patience, self.min_excess = ratio, patience, min_excess
        self.streak: dict[int, int] = {}
        self.named: set[int] = set()

    def ratios(self, seconds: Sequence[float]) -> list[tuple[float, float]]:
        """Per rank: (its figure over the median of the others', that median)."""
        order = sorted(range(len(seconds)), key=seconds.__getitem__)
        ordered = [seconds[r] for r in order]
        place = {r: i for i, r in enumerate(order)}
        out = []
        for r, s in enumerate(seconds):
            median = median_without(ordered, place[r])
            ratio = s / median if median > 0 else (math.inf if s > 0 else 1.0)
            out.append((ratio, median))
        return out

    def window(self, seconds: Sequence[float]) -> tuple[list[float], list[StragglerEvent]]:
        """One record's per-rank figures: each rank's ratio, and the episodes that begin (a rank
        slow ``patience`` windows in a row) or end (a named rank no longer slow) with it."""
        events, ratios = [], []
        for r, (ratio, median) in enumerate(self.ratios(seconds)):
            ratios.append(ratio)
            slow = ratio >= self.ratio and seconds[r] - median >= self.min_excess
            streak = self.streak[r] = self.streak.get(r, 0) + 1 if slow else 0
            if slow and streak >= self.patience and r not in self.named:
                self.named.add(r)
                events.append(StragglerEvent("straggler", r, ratio, seconds[r], median, streak))
            elif not slow and r in self.named:
                self.named.discard(r)
                events.append(StragglerEvent("recovered", r, ratio, seconds[r], median, 0))
        return ratios, events


@HOOKS.register_module()
class StragglerHook(Hook, RankFigures):
    """Per-rank time before the step's collective: ``straggler/rank_<r>_s``,
    ``straggler/spread`` and ``straggler/slowest_rank`` in each training record, and a warning
    naming a rank that stays slow (``watchdog.straggler_ratio``, ``watchdog.straggler_patience``).

    Each rank times, with torch's module and optimizer hooks and no synchronisation, the seconds
    from the end of one optimizer step to the end of the next forward pass (batch wait, the hooks
    before the step, forward; under FSDP up to the forward's start) — what the others wait for in
    the gradient all-reduce. The figures cross ranks only in LoggerHook's collective at its
    records (this hook is a :class:`~distributed_runner.engine.extension_points.RankFigures`
    provider). Nothing is attached in a single process; with no LoggerHook nothing is reported.
    Ranks: all time and decide alike; rank 0 logs. See :mod:`hooks.straggler_hook` for what is left
    out and why.
    """

    priority = "VERY_LOW"  # attaches after the other hooks' before_train (which may swap things)

    def __init__(self) -> None:
        self.clock = PreCollectiveClock()
        self.watch: StragglerWatch | None = None

    def before_train(self, runner: RunnerAPI) -> None:
        settings = runner.settings.watchdog  # the config's watchdog section, parsed once
        self.watch = StragglerWatch(settings["straggler_ratio"], settings["straggler_patience"])
        model = runner.wrapped_model
        optimizer = getattr(runner.optim_wrapper, "optimizer", None)
        # the same answer on every rank (the figures' shape must match in LoggerHook's gather)
        if (
            dist.is_distributed()
            and isinstance(model, torch.nn.Module)
            and isinstance(optimizer, torch.optim.Optimizer)
        ):
            fsdp = isinstance(runner.strategy, dict) and runner.strategy.get("type") == "fsdp"
            self.clock.attach(model, optimizer, fsdp)

    def after_train(self, runner: RunnerAPI) -> None:
        self.clock.detach()

    # what is not a training step is left out (module docstring)
    def before_train_epoch(self, runner: RunnerAPI) -> None:
        self.clock.restart()

    def before_val(self, runner: RunnerAPI) -> None:
        self.clock.pause()

    def after_save_checkpoint(self, runner: RunnerAPI, path: Any, checkpoint: Any) -> None:
        self.clock.pause()  # rank 0 wrote (and may upload it next): slow, but no straggler

    # RankFigures: LoggerHook gathers these at its records
    def rank_figures(self) -> Sequence[float]:
        return self.clock.take() if self.clock.attached else ()

    def figures_gathered(self, runner: RunnerAPI, per_rank: list[list[float]]) -> dict[str, float]:
        seconds = [row[0] for row in per_rank]
        if self.watch is None or any(math.isnan(s) for s in seconds):
            return {}  # nothing timed (a model's own train_step calls no wrapped forward)
        ratios, events = self.watch.window(seconds)
        slowest = max(range(len(ratios)), key=ratios.__getitem__)
        scalars = {f"straggler/rank_{r}_s": s for r, s in enumerate(seconds)}
        scalars["straggler/spread"] = ratios[slowest]
        scalars["straggler/slowest_rank"] = float(slowest)
        if runner.rank == 0:
            for event in events:
                self._log(runner, event)
        return scalars

    def _log(self, runner: RunnerAPI, event: StragglerEvent) -> None:
        watch = self.watch
        assert watch is not None
        where = (
            f"straggler: rank {event.rank} at iteration {runner.iter + 1}: {event.ratio:.2f}x "
            f"the median of the other ranks before entering the step's collective "
            f"({event.seconds:.4f} s vs {event.median:.4f} s per step)"
        )
        if event.kind == "straggler":
            runner.logger.warning(
                "%s for %d logging windows in a row; every rank waits for it "
                "(watchdog.straggler_ratio=%g, watchdog.straggler_patience=%d)",
                where,
                event.windows,
                watch.ratio,
                watch.patience,
            )
        else:  # a warning too: whoever saw the episode begin sees it end
            runner.logger.warning("%s: recovered", where)
