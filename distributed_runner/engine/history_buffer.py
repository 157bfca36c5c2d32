"""HistoryBuffer: the recent values of one MessageHub scalar (``train/loss`` ...).

Scalars may be recorded as 0-dim tensors, and recording one costs a list append: the tensor is
kept as it is and turned into a float only when read, all the values a read needs in one
conversion (``torch.stack(...).tolist()``; on a CPU ``.item()`` each, which is cheaper there),
and the floats replace the tensors in the history. On a GPU that keeps the step free of a device
sync per logged value; on a CPU it saves a conversion per value per step — the logger pays for
them once per logging interval instead. A history holds at most ``history`` values, tensors or not.

A hook that records the same scalar every iteration (RuntimeInfoHook's ``train/lr`` and losses,
IterTimerHook's ``train/time``) takes a *writer* for it
(:meth:`~distributed_runner.engine.message_hub.MessageHub.scalar_writer`): a bounded deque's
``append``, one C call. Its values join the key's history before anything reads or writes that
history — every :class:`HistoryBuffer` method, ``log_scalars``, ``get_scalar``, ``update_scalar``,
``state_dict`` — so a reader (a logger, a ported OpenMMLab hook, one holding the buffer between
iterations) finds exactly what it would have found had each value gone through ``update_scalar`` at
once. A key has one writer; ``update_scalar`` on the same key also keeps the order. A writer may
append raw figures with a ``convert(figure) -> (value, count)``, applied when they are taken in:
IterTimerHook's throughput notes each step's sample count and seconds, and the rate (weighted by the
step's microseconds) is computed when a reader needs it. Only a reader that deletes or replaces a
history while its writer is in use (``del hub.log_scalars[key]``) may see the values written after
that in the history it dropped, until the hub's scalars are next read.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Any

import torch

DEFAULT_HISTORY = 1000
Convert = Callable[[Any], tuple[Any, int]]  # a writer's figure -> (value, count)


def _as_floats(values: Iterable[Any]) -> list[float]:
    values = list(values)
    tensors = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    if tensors:
        picked = [values[i] for i in tensors]
        try:
            if all(t.is_cpu for t in picked):  # on a CPU, .item() each is cheaper than a stack
                converted = [t.item() for t in picked]
            else:  # one conversion (one device sync) for all of them, not one .item() each
                converted = torch.stack(picked).tolist()
        except RuntimeError:  # several elements, mixed dtypes or shapes: the mean of each
            converted = [t.detach().double().mean().item() for t in picked]
        for i, c in zip(tensors, converted, strict=True):
            values[i] = c
    return [float(v) for v in values]


_FLOAT = {float}


class HistoryBuffer:
    """The last ``max_length`` values of one scalar.

    Values may carry a count (``update(mean, count=n)``) for weighted means; the counts are only
    kept once a count other than 1 has been given, so the common case is one append. A writer's
    values (``_pending``, :meth:`MessageHub.scalar_writer`) are taken in before every read and
    write.
    """

    __slots__ = ("_convert", "_counts", "_pending", "_values", "append_one")

    def __init__(self, max_length: int = DEFAULT_HISTORY) -> None:
        self._values: deque = deque(maxlen=max_length)
        self._counts: deque | None = None
        self._pending: deque | None = None  # the key's writer's values, not taken in yet
        self._convert: Convert | None = None  # its figure -> (value, count), if it has one
        # record a value of count 1: the deque's own append until counts or a writer are kept
        self.append_one = self._values.append

    def _attach(self, pending: deque, convert: Convert | None = None) -> None:
        """Take the values of a writer's deque from now on (before every read and write)."""
        if self._pending is pending and self._convert is convert:
            return
        if self._pending:
            self._take()
        self._pending, self._convert = pending, convert
        self.append_one = self.update  # the writer's values first

    def _detach(self) -> None:
        """Another history of the same key took over its writer (this one was replaced)."""
        self._pending = self._convert = None
        self.append_one = self._values.append if self._counts is None else self._append_with_count

    def _take(self) -> None:
        """The writer's values, appended in the order written (count 1 each, or converted)."""
        pending = self._pending
        if not pending:
            return
        if self._convert is not None:  # update(*convert(figure)) for each, written out
            figures = list(pending)
            pending.clear()
            convert, values, counts = self._convert, self._values, self._counts
            for figure in figures:
                value, count = convert(figure)
                values.append(value)
                if counts is not None:
                    counts.append(count)
                elif count != 1:
                    self._add_count(count)
                    counts = self._counts
            return
        if self._counts is not None:
            self._counts.extend([1] * len(pending))
        self._values.extend(pending)
        pending.clear()

    def update(self, value: Any, count: int = 1) -> None:
        if self._pending:
            self._take()
        self._values.append(value)  # the hot path: a tensor is converted when read
        if count != 1 or self._counts is not None:
            self._add_count(count)

    def _add_count(self, count: int) -> None:
        if self._counts is None:
            self._counts = deque([1] * (len(self._values) - 1), maxlen=self._values.maxlen)
            if self._pending is None:
                self.append_one = self._append_with_count
        self._counts.append(count)

    def _append_with_count(self, value: Any) -> None:
        self._values.append(value)
        self._counts.append(1)  # type: ignore[union-attr]  # installed once counts exist

    def _last(self, n: int) -> list[float]:
        """The last ``n`` values as floats, newest first; tensors among them are converted in one
        go and replaced by their floats."""
        values = self._values
        recent = list(islice(reversed(values), n))
        if set(map(type, recent)) != _FLOAT:
            recent = _as_floats(recent)
            for i, v in enumerate(recent, start=1):
                values[-i] = v
        return recent

    def __len__(self) -> int:
        if self._pending:
            self._take()
        return len(self._values)

    def current(self) -> float:
        if self._pending:
            self._take()
        if not self._values:
            raise ValueError("empty history")
        last = self._values[-1]
        return last if type(last) is float else float(self._last(1)[0])

    def mean(self, window: int | None = None) -> float:
        """Mean of the last ``window`` values (weighted by their counts); all if None."""
        if self._pending:
            self._take()
        values = self._values
        if not values:
            raise ValueError("empty history")
        n = len(values) if window is None else min(window, len(values))
        if self._counts is None and type(values[-1]) is float:  # usually floats only, then
            total = sum(islice(reversed(values), n))  # a tensor or an int among them makes the
            if type(total) is float:  # sum something else: the general way
                return total / n
        vals = self._last(n)
        if self._counts is None:
            return sum(vals) / n
        counts = list(islice(reversed(self._counts), n))
        return sum(v * c for v, c in zip(vals, counts, strict=True)) / sum(counts)

    def values(self) -> list[float]:
        if self._pending:
            self._take()
        return self._last(len(self._values))[::-1]

    def counts(self) -> list[int]:
        if self._pending:
            self._take()
        return list(self._counts) if self._counts is not None else [1] * len(self._values)

    def state_dict(self) -> dict:
        return {"values": self.values(), "counts": self.counts(), "max_length": self._values.maxlen}

    @classmethod
    def from_state(cls, state: dict) -> HistoryBuffer:
        buf = cls(int(state.get("max_length", DEFAULT_HISTORY)))
        for v, c in zip(state["values"], state["counts"], strict=True):
            buf.update(float(v), int(c))
        return buf
