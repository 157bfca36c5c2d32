"""MessageHub: where hooks leave runtime info and scalar histories for each other.

Some runtime info is *derived* rather than written: a key whose value is a function of state its
owner keeps anyway (IterTimerHook's ``eta``: the time and iteration of the last step it timed) is
registered with :meth:`MessageHub.derive_info` and computed when someone reads it, so the
training thread does not pay for a value per iteration that a logger reads every tenth. A reader
sees what it would have seen had the owner written the value at the same point: a value written
with ``update_info`` wins until the owner's next update (the provider's ``stamp`` changes), and a
provider with nothing to say yet (no step timed) leaves whatever was stored (a resumed run's
checkpointed ``eta``).

How scalars are kept (tensors converted when read, writers' values taken in before any read):
:mod:`distributed_runner.engine.history_buffer`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, MutableMapping
from functools import partial
from typing import Any, Protocol

from distributed_runner.engine.history_buffer import DEFAULT_HISTORY, Convert, HistoryBuffer

__all__ = [
    "DEFAULT_HISTORY",
    "MISSING",
    "HistoryBuffer",
    "InfoProvider",
    "MessageHub",
    "RuntimeInfo",
]


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


class MessageHub:
    """Runtime info (``epoch``, ``iter``, ``eta`` ...) and scalar histories (``train/loss`` ...).

    Scalars a hook records every step go through a writer (:meth:`scalar_writer`): one append,
    taken into the key's history before anything reads or writes it
    (:mod:`distributed_runner.engine.history_buffer`), so a reader finds exactly what it would have
    found had every value been written with :meth:`update_scalar` at once.
    """

    def __init__(self, history: int = DEFAULT_HISTORY) -> None:
        self._history = history
        self.runtime_info = RuntimeInfo()
        self._log_scalars: dict[str, HistoryBuffer] = {}
        # key -> its writer's values and their conversion (scalar_writer)
        self._writers: dict[str, tuple[deque, Convert | None]] = {}
        self._holders: dict[str, HistoryBuffer] = {}  # key -> the history taking them

    @property
    def log_scalars(self) -> dict[str, HistoryBuffer]:
        """Key -> history, every writer's value taken in first."""
        if self._writers:
            self._take_writers()
        return self._log_scalars

    @log_scalars.setter
    def log_scalars(self, value: dict[str, HistoryBuffer]) -> None:
        self._replace_histories(value)

    def _replace_histories(self, histories: dict[str, HistoryBuffer]) -> None:
        """What was written belongs to the histories being replaced: taken in, and they let go
        of the writers, which the new histories of the same keys take over."""
        if self._writers:
            self._take_writers()
            for held in self._holders.values():
                held._detach()
            self._holders.clear()
        self._log_scalars = histories
        for key, writer in self._writers.items():
            buf = histories.get(key)
            if buf is not None:
                self._attach(key, buf, writer)

    def scalar_writer(self, key: str, convert: Convert | None = None) -> Callable[[Any], None]:
        """``write(value)`` records ``value`` for ``key`` as ``update_scalar(key, value)`` would
        (:mod:`distributed_runner.engine.history_buffer`), for an owner that records ``key`` every
        iteration: one append. With ``convert``, ``write(figure)`` records
        ``update_scalar(key, *convert(figure))``, converted when the history is read."""
        writer = self._writers.get(key)
        if writer is not None and writer[1] is not convert:  # a new owner: the old one's first
            self._take_writers()
            writer = None
        if writer is None:
            writer = self._writers[key] = (deque(maxlen=self._history), convert)
        buf = self._log_scalars.get(key)
        if buf is not None:
            self._attach(key, buf, writer)
        return writer[0].append

    def _take_writers(self) -> None:
        """Every writer's values into its key's history (made if missing)."""
        scalars = self._log_scalars
        for key, writer in self._writers.items():
            buf = scalars.get(key)
            if buf is None:
                if not writer[0]:
                    continue
                buf = scalars[key] = HistoryBuffer(self._history)
            self._attach(key, buf, writer)
            buf._take()

    def _attach(self, key: str, buf: HistoryBuffer, writer: tuple[deque, Convert | None]) -> None:
        """``buf`` takes the writer's values of ``key`` from now on; the history that took them
        before (deleted or replaced since) lets go: values not taken yet are ``buf``'s."""
        before = self._holders.get(key)
        if before is not buf:
            if before is not None:
                before._detach()
            self._holders[key] = buf
        buf._attach(*writer)

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
        """Record ``value`` (after the values ``key``'s writer, if any, wrote before it)."""
        buf = self._log_scalars.get(key)
        if buf is None or count != 1:
            if buf is None:
                buf = self._log_scalars[key] = HistoryBuffer(self._history)
                writer = self._writers.get(key)
                if writer is not None:  # its writer's values so far come first
                    self._attach(key, buf, writer)
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
        # what was written before the load belongs to the state it replaces: taken in, then
        # dropped with it, as if it had been written at once
        self.runtime_info.update(state.get("runtime_info", {}))
        self._replace_histories(
            {k: HistoryBuffer.from_state(s) for k, s in state.get("log_scalars", {}).items()}
        )
