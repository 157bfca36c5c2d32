"""Requests from hooks to the loop, agreed on by every rank (hooks request, the loop acts).

A hook calls ``runner.request_stop(reason)``, ``runner.request_checkpoint(reason)`` or
``runner.request_val(reason)`` on any rank, at any mount point. The training loop calls
:meth:`ControlRequests.resolve` at its safe points — after every training iteration (counters
advanced) and after every validation — on every rank. In a distributed run that is one
all-reduce (MAX) of four flags, so a request raised on one rank only is seen by all ranks at the
same iteration and nobody waits for a collective the others never enter. Reasons travel only when
a flag is set (rare), with an ``all_gather_object``.

Acted in this order: checkpoint, validation, stop; ``preempt`` (SIGTERM, see
:mod:`distributed_runner.preemption`) writes a checkpoint and ends the run unfinished.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from . import dist

KINDS = ("checkpoint", "val", "stop", "preempt")


class ControlRequests:
    """Pending requests of this rank, and their cross-rank resolution."""

    def __init__(self) -> None:
        self._pending: dict[str, list[str]] = {k: [] for k in KINDS}
        self._any = False
        self.log: list[tuple[int, str, tuple[str, ...]]] = []  # (iter, kind, reasons) acted on

    def request(self, kind: str, reason: str) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown request {kind!r}; one of {', '.join(KINDS)}")
        self._pending[kind].append(str(reason))
        self._any = True

    @property
    def pending(self) -> bool:
        """Whether this rank has an unresolved request (no collective)."""
        return self._any

    def resolve(self) -> dict[str, tuple[str, ...]]:
        """Kind -> reasons for every kind requested on any rank; collective when distributed.

        Every rank must call this equally often.
        """
        if not dist.is_distributed():
            if not self._any:
                return {}
            agreed = {k: tuple(v) for k, v in self._pending.items() if v}
            self.clear()
            return agreed
        flags = torch.tensor([1 if self._pending[k] else 0 for k in KINDS], dtype=torch.int32)
        flags = dist.all_reduce(flags, "max")
        if not int(flags.sum()):
            return {}
        mine = {k: list(v) for k, v in self._pending.items() if v}
        self.clear()
        agreed: dict[str, list[str]] = {}
        for rank, theirs in enumerate(dist.all_gather_object(mine)):
            for kind, reasons in theirs.items():
                for reason in reasons:
                    text = f"{reason} (rank {rank})"
                    if text not in agreed.setdefault(kind, []):
                        agreed[kind].append(text)
        return {k: tuple(agreed.get(k, ())) for k, flag in zip(KINDS, flags.tolist()) if flag}

    def clear(self) -> None:
        for reasons in self._pending.values():
            reasons.clear()
        self._any = False

    def record(self, iteration: int, kind: str, reasons: tuple[str, ...],
               logger: logging.Logger | Any) -> None:
        """Keep and log what the loop did and why."""
        self.log.append((iteration, kind, reasons))
        logger.info("%s at iteration %d, requested by: %s", kind, iteration, "; ".join(reasons))
