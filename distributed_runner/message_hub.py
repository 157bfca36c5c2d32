"""MessageHub: where hooks leave runtime info and scalar histories for each other.

Some runtime info is *derived* rather than written: a key whose value is a function of state its
owner keeps anyway (IterTimerHook's ``eta``: the time and iteration of the last step it timed) is
registered with :meth:`MessageHub.derive_info` and computed when someone reads it, so the
training thread does not pay for a value per iteration that a logger reads every tenth. A reader
sees what it would have seen had the owner written the value at the same point: a value written
with ``update_info`` wins until the owner's next update (the provider's ``stamp`` changes), and a
provider with nothing to say yet (no step timed) leaves whatever was stored (a resumed run's
checkpointed ``eta``).

Scalars may be recorded as 0-dim tensors, and recording one costs a list append: the tensor is
kept as it is and turned into a float only when read, all the values a read needs in one
conversion (``torch.stack(...).tolist()``; on a CPU ``.item()`` each, which is cheaper there),
and the floats replace the tensors in the history. On a GPU that keeps the step free of a device
sync per logged value; on a CPU it saves a conversion per value per step — the logger pays for
them once per logging interval instead. A history holds at most ``history`` values, tensors or not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from functools import partial
from itertools import islice
from typing import Any, Protocol

import torch

DEFAULT_HISTORY = 1000


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
    kept once a count other than 1 has been given, so the common case is one append.
    """

    __slots__ = ("_counts", "_values", "append_one")

    def __init__(self, max_length: int = DEFAULT_HISTORY) -> None:
        self._values: deque = deque(maxlen=max_length)
        self._counts: deque | None = None
        # record a value of count 1: the deque's own append until counts are kept
        self.append_one = self._values.append

    def update(self, value: Any, count: int = 1) -> None:
        self._values.append(value)  # the hot path: a tensor is converted when read
        if count != 1 or self._counts is not None:
            self._add_count(count)

    def _add_count(self, count: int) -> None:
        if self._counts is None:
            self._counts = deque([1] * (len(self._values) - 1), maxlen=self._values.maxlen)
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
        return len(self._values)

    def current(self) -> float:
        if not self._values:
            raise ValueError("empty history")
        last = self._values[-1]
        return last if type(last) is float else float(self._last(1)[0])

    def mean(self, window: int | None = None) -> float:
        """Mean of the last ``window`` values (weighted by their counts); all if None."""
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
        return self._last(len(self._values))[::-1]

    def counts(self) -> list[int]:
        return list(self._counts) if self._counts is not None else [1] * len(self._values)

    def state_dict(self) -> dict:
        return {"values": self.values(), "counts": self.counts(), "max_length": self._values.maxlen}

    @classmethod
    def from_state(cls, state: dict) -> HistoryBuffer:
        buf = cls(int(state.get("max_length", DEFAULT_HISTORY)))
        for v, c in zip(state["values"], state["counts"], strict=True):
            buf.update(float(v), int(c))
        return buf


MISSING: Any = object()  # a provider's answer when it has no value (yet)


class InfoProvider(Protocol):
    """The owner of a derived runtime key: ``value()`` computes it (or returns :data:`MISSING`),
    ``stamp()`` changes whenever the owner would have written a new value."""

    def value(self) -> Any: ...

    def stamp(self) -> Any: ...


class RuntimeInfo(MutableMapping):
    """``MessageHub.runtime_info``: a mapping of stored values and derived keys (module
    docstring). Reads of a derived key ask its provider; writes are stored and win until the
    provider's stamp moves on."""

    __slots__ = ("_providers", "_stored", "_written_at")

    def __init__(self) -> None:
        self._stored: dict[str, Any] = {}
        self._providers: dict[str, InfoProvider] = {}
        self._written_at: dict[str, Any] = {}  # derived key -> provider stamp when written

    def derive(self, key: str, provider: InfoProvider | None) -> None:
        """Compute ``key`` from ``provider`` from now on (None: stored values only again)."""
        if provider is None:
            self._providers.pop(key, None)
        else:
            self._providers[key] = provider
        self._written_at.pop(key, None)

    def store_for(self, key: str) -> Any:
        """A cheap writer of ``key`` (not a derived one): ``store_for('iter')(value)``; for an
        owner that writes the same key every iteration."""
        if key in self._providers:
            raise ValueError(f"runtime info {key!r} is derived; write it with update_info")
        return partial(self._stored.__setitem__, key)

    def __getitem__(self, key: str) -> Any:
        provider = self._providers.get(key)
        if provider is not None and self._written_at.get(key, MISSING) is not provider.stamp():
            value = provider.value()
            if value is not MISSING:
                return value
        return self._stored[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._stored[key] = value
        provider = self._providers.get(key)
        if provider is not None:
            self._written_at[key] = provider.stamp()

    def __delitem__(self, key: str) -> None:
        del self._stored[key]

    def _present(self) -> list[str]:
        derived = [
            k
            for k, p in self._providers.items()
            if k not in self._stored and p.value() is not MISSING
        ]
        return [*self._stored, *derived]

    def __iter__(self) -> Iterator[str]:
        return iter(self._present())

    def __len__(self) -> int:
        return len(self._present())

    def __contains__(self, key: object) -> bool:
        try:
            self[key]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __repr__(self) -> str:
        return f"RuntimeInfo({dict(self.items())!r})"


NOTES_PER_STEP = 16  # the note stream keeps NOTES_PER_STEP x history notes at most


class MessageHub:
    """Runtime info (``epoch``, ``iter``, ``eta`` ...) and scalar histories (``train/loss`` ...).

    Scalars a hook records every step may be *noted* rather than written: the hook appends
    ``(write, figures)`` to the hub's note stream (:meth:`note_stream`), and the hub calls
    ``write(figures)`` for every note, in the order noted, whenever anyone touches the scalars
    (``log_scalars``, ``get_scalar``, ``update_scalar``, ``state_dict``, ``load_state_dict``).
    ``write`` records with :meth:`write_scalar` the values it would have recorded at once. So a
    reader finds exactly what it would have found had every value been written when noted, and a
    step pays for an append. The stream keeps at most ``NOTES_PER_STEP x history`` notes; only a
    run that notes more than that per step and reads nothing for ``history`` steps would lose
    values still inside a history.
    """

    def __init__(self, history: int = DEFAULT_HISTORY) -> None:
        self._history = history
        self.runtime_info = RuntimeInfo()
        self._log_scalars: dict[str, HistoryBuffer] = {}
        self._noted: deque[tuple[Callable[[Any], None], Any]] = deque(
            maxlen=NOTES_PER_STEP * history
        )

    @property
    def log_scalars(self) -> dict[str, HistoryBuffer]:
        """Key -> history, every noted value written first."""
        if self._noted:
            self._write_noted()
        return self._log_scalars

    @log_scalars.setter
    def log_scalars(self, value: dict[str, HistoryBuffer]) -> None:
        self._log_scalars = value

    def note_stream(self) -> Callable[[tuple[Callable[[Any], None], Any]], None]:
        """The append of the note stream (class docstring): ``note((write, figures))``."""
        return self._noted.append

    def _write_noted(self) -> None:
        noted = self._noted
        while noted:
            write, figures = noted.popleft()
            write(figures)

    def update_info(self, key: str, value: Any) -> None:
        self.runtime_info[key] = value

    def update_info_dict(self, info: dict) -> None:
        self.runtime_info.update(info)

    def get_info(self, key: str, default: Any = None) -> Any:
        return self.runtime_info.get(key, default)

    def derive_info(self, key: str, provider: InfoProvider | None) -> None:
        """Have ``key`` computed by ``provider`` when read (module docstring)."""
        self.runtime_info.derive(key, provider)

    def update_scalar(self, key: str, value: Any, count: int = 1) -> None:
        """Record ``value``, after every value noted before it."""
        if self._noted:
            self._write_noted()
        self.write_scalar(key, value, count)

    def write_scalar(self, key: str, value: Any, count: int = 1) -> None:
        """Record ``value`` now, noted values or not: what a note's ``write`` records with."""
        buf = self._log_scalars.get(key)
        if buf is None or count != 1:
            if buf is None:
                buf = self._log_scalars[key] = HistoryBuffer(self._history)
            buf.update(value, count)
        else:
            buf.append_one(value)

    def update_scalars(self, scalars: dict, prefix: str = "") -> None:
        for k, v in scalars.items():
            self.update_scalar(prefix + k, v)

    def get_scalar(self, key: str) -> HistoryBuffer:
        return self.log_scalars[key]

    @property
    def history_length(self) -> int:
        """How many values each scalar history keeps."""
        return self._history

    def state_dict(self) -> dict:
        """Plain containers only (checkpoints are loaded with ``weights_only=True``)."""
        info = {
            k: v
            for k, v in self.runtime_info.items()
            if isinstance(v, (int, float, str, bool, type(None)))
        }
        return {
            "runtime_info": info,
            "log_scalars": {k: b.state_dict() for k, b in self.log_scalars.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        # what was noted before the load belongs to the state it replaces: written, then
        # dropped with it, as if it had been written at once
        self._write_noted()
        self.runtime_info.update(state.get("runtime_info", {}))
        self._log_scalars = {
            k: HistoryBuffer.from_state(s) for k, s in state.get("log_scalars", {}).items()
        }
