"""The meeting point of a Ray Train trial and its workers: a tiny asyncio actor (0 CPUs) that the
trial creates and every worker finds by name.

Why an actor and not Ray Train's own report path: a ``ray.train.UserCallback`` runs in the Train
controller, which learns of a report only when it polls the workers, and blocking its
``after_report`` does not hold them. Measured on Ray 2.60 (1 worker reporting every 0.3 s, the
callback blocking 4 s on report 1): ``ray.train.report`` returned at once for reports 1 and 2 and
the worker only waited inside report 3 — each worker's result queue holds one report, and the one
being handled is already out of it. Tune's checkpoint would then be two reports behind the
workers. Holding the workers themselves, inside the report
(:class:`hooks.ray_trial_hook.RayTrialHook`), is exact, and then the report may as well travel
straight to the trial.

The protocol, all calls cheap and non-blocking for the caller except the two waits. Reports
are keyed by the iteration they were made at, the same on every rank and across a restart of the
worker group (``launcher.max_failures``), which repeats iterations from its checkpoint:

* rank 0 :meth:`put_report` ``(iter, metrics, checkpoint)`` — dropped when that iteration was
  reported already —; every rank then :meth:`wait_released` ``(iter)``, which returns once the
  trial :meth:`release` d that report (or a later one) — or at once after a stop, returning the
  stop's reason;
* the trial takes reports in order with :meth:`take_report`;
* :meth:`stop` records the reason (the first one wins) and frees every waiter; rank 0 keeps one
  :meth:`wait_stop` call outstanding and checks it with ``ray.wait(timeout=0)``, so polling costs
  the training loop nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any


class TrialSignal:
    """Reports from rank 0 to the trial, releases and the stop request from the trial to the
    workers (see the module docstring)."""

    def __init__(self) -> None:
        # asyncio objects bind to the actor's event loop at first use (Python >= 3.10)
        self._reports: asyncio.Queue[tuple[int, dict, str | None]] = asyncio.Queue()
        self._changed = asyncio.Condition()
        self._released = -1  # the iteration whose report the trial let go on from
        self._reported = -1  # the newest iteration reported
        self._stop_reason: str | None = None

    async def put_report(self, index: int, metrics: dict[str, Any], checkpoint: str | None) -> bool:
        """Queue the report made at iteration ``index``; ``False`` (dropped) when the trial has
        had that iteration's report already."""
        if index <= self._reported:
            return False
        self._reported = index
        await self._reports.put((index, metrics, checkpoint))
        return True

    async def take_report(self) -> tuple[int, dict, str | None]:
        return await self._reports.get()

    async def release(self, index: int) -> None:
        async with self._changed:
            self._released = max(self._released, index)
            self._changed.notify_all()

    async def stop(self, reason: str) -> None:
        async with self._changed:
            if self._stop_reason is None:
                self._stop_reason = reason
            self._changed.notify_all()

    async def wait_released(self, index: int) -> str | None:
        """Return when report ``index`` is released (``None``) or the run is stopped (the
        reason)."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._released >= index or self._stop_reason is not None
            )
            return self._stop_reason

    async def wait_stop(self) -> str:
        async with self._changed:
            await self._changed.wait_for(lambda: self._stop_reason is not None)
            assert self._stop_reason is not None
            return self._stop_reason
