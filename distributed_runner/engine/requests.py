"""Requests from hooks to the loop, agreed on by every rank (hooks request, the loop acts).

A hook calls ``runner.request_stop(reason)``, ``runner.request_checkpoint(reason)`` or
``runner.request_val(reason)`` on any rank, at any mount point. The training loop calls
:meth:`ControlRequests.resolve` at its safe points — after training iterations (counters
advanced) and after every validation — on every rank. In a distributed run that is one
all-reduce (MAX) of five ints: one flag per kind of request (:data:`KINDS`: checkpoint, val, stop,
preempt) and the agreement interval rank 0 proposes (``agree_every='auto'``, below; 0 when it
proposes none). So a request raised on one rank only is seen by all ranks at the same iteration
and nobody waits for a collective the others never enter. Reasons travel only when a flag is set
(rare), with an ``all_gather_object``.

How often ranks agree after iterations is ``train_cfg.agree_every``: an int, or ``'auto'`` (the
default): every iteration for the first :data:`AUTO_PROBE` iterations while rank 0 times the
agreement and the step, then every N iterations with N the smallest number that keeps agreeing
under :data:`AUTO_SHARE` of the step time (at most :data:`AUTO_MAX`). Rank 0's N travels in the
same all-reduce, so all ranks switch at the same iteration. On GPU clusters with real models
N stays 1; on a small CPU model over gloo, where one collective costs as much as a step, a request
waits a few more iterations instead of slowing every one.

Acted in this order: checkpoint, validation, stop; ``preempt`` (SIGTERM, see
:mod:`distributed_runner.core.preemption`) writes a checkpoint and ends the run unfinished.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

from distributed_runner.core import dist

KINDS = ("checkpoint", "val", "stop", "preempt")
AUTO_PROBE = 20  # iterations timed before 'auto' picks its interval
AUTO_SHARE = 0.01  # agreeing may cost at most this share of the step time
AUTO_MAX = 50  # ... but requests wait at most this many iterations


class ControlRequests:
    """The requests raised on this rank and not resolved yet, and their cross-rank resolution.

    ``unresolved`` is this rank's own flag, read without a collective: whether it holds a request
    the ranks have not agreed on yet (the loop, when it does not agree on a schedule, resolves
    only then).
    """

    def __init__(self) -> None:
        # kind -> the reasons given on this rank since the last resolution
        self._reasons: dict[str, list[str]] = {k: [] for k in KINDS}
        self.unresolved = False  # whether this rank holds a request not resolved yet
        self.agreed_extra = 0
        self.set_agree_every("auto")
        self.log: list[tuple[int, str, tuple[str, ...]]] = []  # (iter, kind, reasons) acted on

    def request(self, kind: str, reason: str) -> None:
        """Note a request of ``kind`` on this rank; the loop acts on it once the ranks agree."""
        if kind not in KINDS:
            raise ValueError(f"unknown request {kind!r}; one of {', '.join(KINDS)}")
        self._reasons[kind].append(str(reason))
        self.unresolved = True

    # -- how often ranks agree after iterations (train_cfg.agree_every) -------------------------
    def set_agree_every(self, agree_every: int | str) -> None:
        self.agree_every = agree_every
        # the interval in force (config_check allows a positive int or 'auto')
        self.agree_n = 1 if agree_every == "auto" else int(agree_every)
        self._probing = agree_every == "auto"  # timing the first iterations to choose N
        self._probe: list[tuple[float, float]] = []  # (step seconds, agreement seconds)
        self._last_agreed = 0.0

    def due(self, iteration: int) -> bool:
        """Whether the ranks agree after completed iteration ``iteration``."""
        return iteration % self.agree_n == 0

    def resolve_after_iter(self, logger: logging.Logger | Any) -> dict[str, tuple[str, ...]]:
        """:meth:`resolve` at an iteration boundary; with ``'auto'``, times the first
        :data:`AUTO_PROBE` of them, then sends rank 0's choice of interval along."""
        if not self._probing:
            return self.resolve()
        deciding = len(self._probe) == AUTO_PROBE
        extra = 0
        if deciding and dist.get_rank() == 0:
            step = sorted(s for s, _ in self._probe)[AUTO_PROBE // 2]
            cost = sorted(c for _, c in self._probe)[AUTO_PROBE // 2]
            extra = min(AUTO_MAX, max(1, math.ceil(cost / max(AUTO_SHARE * step, 1e-9))))
        start = time.perf_counter()
        agreed = self.resolve(extra)
        end = time.perf_counter()
        if deciding:
            self.agree_n = max(1, self.agreed_extra)
            self._probing = False
            logger.info(
                "ranks agree on requests every %d iteration(s) (train_cfg.agree_every='auto')",
                self.agree_n,
            )
        else:
            if self._last_agreed:
                self._probe.append((start - self._last_agreed, end - start))
            self._last_agreed = end
        return agreed

    def resolve(self, extra: int = 0) -> dict[str, tuple[str, ...]]:
        """Kind -> reasons for every kind requested on any rank; collective when distributed.

        Every rank must call this equally often. ``extra`` (a non-negative int) rides along; the
        largest value any rank sent is left in :attr:`agreed_extra`.
        """
        if not dist.is_distributed():
            if not self.unresolved:
                return {}
            agreed = {k: tuple(v) for k, v in self._reasons.items() if v}
            self.clear()
            return agreed
        flags = torch.tensor(
            [1 if self._reasons[k] else 0 for k in KINDS] + [int(extra)], dtype=torch.int32
        )
        flags = dist.all_reduce(flags, "max")
        self.agreed_extra = int(flags[-1])
        flags = flags[:-1]
        if not int(flags.sum()):
            return {}
        mine = {k: list(v) for k, v in self._reasons.items() if v}
        self.clear()
        gathered: dict[str, list[str]] = {}
        for rank, theirs in enumerate(dist.all_gather_object(mine)):
            for kind, reasons in theirs.items():
                for reason in reasons:
                    text = f"{reason} (rank {rank})"
                    if text not in gathered.setdefault(kind, []):
                        gathered[kind].append(text)
        return {
            k: tuple(gathered.get(k, ()))
            for k, flag in zip(KINDS, flags.tolist(), strict=True)
            if flag
        }

    def clear(self) -> None:
        """Forget this rank's unresolved requests (they were resolved, or are dropped)."""
        for reasons in self._reasons.values():
            reasons.clear()
        self.unresolved = False

    def record(
        self, iteration: int, kind: str, reasons: tuple[str, ...], logger: logging.Logger | Any
    ) -> None:
        """Keep and log what the loop did and why."""
        self.log.append((iteration, kind, reasons))
        logger.info("%s at iteration %d, requested by: %s", kind, iteration, "; ".join(reasons))
