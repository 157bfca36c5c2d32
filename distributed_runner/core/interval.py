"""One interval spec for every periodic hook.

``interval`` is an int — epochs when the hook's ``by_epoch`` is true, iterations otherwise — or a
string with a unit: ``'500it'``, ``'2ep'``, ``'90s'``, ``'30min'``, ``'1h'``. ``0`` or a negative
int means never.

Wall-time intervals must fire on the same iteration on every rank (the hooks that use them save
checkpoints or reduce logs, both collectives), and clocks differ between machines: rank 0
decides. LoggerHook broadcasts the decision (one one-element all-reduce per check, only for
wall-time intervals in a distributed run); CheckpointHook turns it into a checkpoint request,
which the ranks agree on anyway (:mod:`distributed_runner.engine.requests`).
"""

from __future__ import annotations

import re
from time import monotonic as _clock
from typing import TYPE_CHECKING, Any

import torch

from distributed_runner.core import dist
from distributed_runner.core.errors import ArgumentError


# The one counting rule periodic things share (hooks' helpers and :class:`Interval`).
#
# A leaf module, importable from ``hooks`` and from the engine alike without either importing the
# other.
def every_nth(done: int, n: int) -> bool:
    """``done`` (counted from the start, 1-based) is a multiple of ``n``; ``n <= 0``: never."""
    return n > 0 and done >= 0 and done % n == 0


if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


_SPEC = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$")


_UNITS = {
    "it": ("iter", 1),
    "iter": ("iter", 1),
    "iters": ("iter", 1),
    "ep": ("epoch", 1),
    "epoch": ("epoch", 1),
    "epochs": ("epoch", 1),
    "s": ("time", 1.0),
    "sec": ("time", 1.0),
    "min": ("time", 60.0),
    "h": ("time", 3600.0),
}


class Interval:
    """A parsed interval: ``kind`` is ``'iter'``, ``'epoch'``, ``'time'`` or ``'never'``."""

    def __init__(self, kind: str, every: float, text: str) -> None:
        self.kind, self.every, self.text = kind, every, text
        # iterations or epochs are counted in whole numbers (``parse`` refuses '1.5it')
        self._count = int(every) if kind in ("iter", "epoch") else 0
        self._last: float | None = None

    @classmethod
    def parse(cls, value: Any, by_epoch: bool, key: str) -> Interval:
        if isinstance(value, Interval):
            return value
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ArgumentError(
                key,
                f"expected an int or a string like '500it', '2ep', '30min', '1h'; got {value!r}",
            )
        if isinstance(value, int):
            if value <= 0:
                return cls("never", 0, str(value))
            return cls("epoch" if by_epoch else "iter", value, str(value))
        match = _SPEC.match(value.lower())
        if not match or match.group(2) not in _UNITS:
            raise ArgumentError(
                key,
                f"cannot read interval {value!r}: use a number and one of the "
                f"units it, ep, s, min, h (e.g. '500it', '2ep', '30min')",
            )
        kind, scale = _UNITS[match.group(2)]
        amount = float(match.group(1)) * scale
        if kind != "time":
            if amount != int(amount) or amount < 1:
                raise ArgumentError(
                    key, f"{value!r}: iterations and epochs must be whole numbers >= 1"
                )
            amount = int(amount)
        elif amount <= 0:
            raise ArgumentError(key, f"{value!r}: a wall-time interval must be positive")
        return cls(kind, amount, value)

    @property
    def never(self) -> bool:
        return self.kind == "never"

    def due_after_iter(self, runner: RunnerAPI, start: int = 0) -> bool:
        """At ``after_train_iter``: an iteration interval or a wall-time interval is due."""
        if self.kind == "iter":
            return every_nth(runner.iter + 1 - start, self._count)
        if self.kind == "time":
            return self.time_due()
        return False

    def due_after_epoch(self, runner: RunnerAPI, start: int = 0) -> bool:
        """At ``after_train_epoch``: an epoch interval is due."""
        return self.kind == "epoch" and every_nth(runner.epoch + 1 - start, self._count)

    def start_clock(self) -> None:
        """Start (or restart) a wall-time interval now — call it at ``before_train``."""
        self._last = _clock()

    def time_due(self, agree: bool = True) -> bool:
        """Rank 0's clock says the interval elapsed; the same answer on every rank (one
        one-element all-reduce when distributed). ``agree=False``: this rank's clock only, no
        collective — for a caller that makes the ranks agree itself (a request)."""
        now = _clock()
        if self._last is None:
            self._last = now
        due = now - self._last >= self.every
        if agree and dist.is_distributed():
            flag = torch.tensor([1 if due and dist.get_rank() == 0 else 0], dtype=torch.int32)
            due = bool(dist.all_reduce(flag, "max").item())
        if due:
            self._last = now
        return due

    def __repr__(self) -> str:
        return f"Interval({self.text!r})"
