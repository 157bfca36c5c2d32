"""The dispatcher's tables and generated callers (:mod:`distributed_runner.dispatch` has the
why): a :class:`Slot` per hook and mount point, the sampled timing pattern, and
:func:`compile_caller`, which unrolls one mount point's table into a function."""

from __future__ import annotations

import functools
import inspect
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hooks.hook import Hook

if TYPE_CHECKING:
    from .hook_order import HookEntry
    from .runner_api import RunnerAPI

TIME_FIRST = 16
TIME_EVERY = 16
_PATTERN_BITS = 12  # a pattern of 4096 calls, about 1 in TIME_EVERY set
_RANDOM = random.Random(0)
_TIMED = bytes(
    i <= TIME_FIRST or _RANDOM.random() < 1 / TIME_EVERY for i in range(1 << _PATTERN_BITS)
)  # call n is timed when _TIMED[n & mask]
_PATTERN_MASK = (1 << _PATTERN_BITS) - 1


class Slot:
    """One hook at one mount point: the method its caller calls, and what calling it cost.

    ``ns``/``timed``: nanoseconds and count of the timed calls; ``call_base``/``call_end``: the
    mount point's call count when the slot entered its table and when it left it (its hook
    disabled), so its calls are ``(call_end or the current count) - call_base`` without a counter
    per hook call. A slot outlives a rebuild of the tables: its counts keep adding up.
    """

    __slots__ = ("call_base", "call_end", "entry", "method", "mount", "ns", "timed")

    def __init__(
        self, entry: HookEntry, mount: str, method: Callable[..., None], call_base: int
    ) -> None:
        self.entry, self.mount, self.method = entry, mount, method
        self.ns = self.timed = 0
        self.call_base: int = call_base
        self.call_end: int | None = None


# -- the callers ----------------------------------------------------------------------------------
@functools.cache
def mount_arguments(mount: str) -> tuple[str, ...]:
    """The keyword arguments of mount point ``mount`` after ``runner`` (``Hook``'s signature):
    hooks are called with all of them, as MMEngine's Runner does; one left out is None."""
    return tuple(inspect.signature(getattr(Hook, mount)).parameters)[2:]


class Callers(dict):
    """Mount point -> caller, each made at its first use after the tables last changed: cleared
    in place on every change (a registration, a disabled hook), so registering N hooks does not
    generate N x 23 functions and whoever holds it (the loops) gets the current callers."""

    def __init__(self, make: Callable[[str], Callable[..., None]]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, mount: str) -> Callable[..., None]:
        caller = self[mount] = self._make(mount)
        return caller


def compile_caller(mount: str, table: tuple[Slot, ...], env: dict[str, Any]) -> Callable[..., None]:
    """The generated caller of ``mount`` for ``table``; what it does is
    :meth:`HookDispatcher.call_reference`, unrolled. For ``after_train_iter`` and two hooks::

        def after_train_iter(batch_idx=None, data_batch=None, outputs=None):
            n = counts['after_train_iter'] = counts['after_train_iter'] + 1
            runner = runner_ref()
            if timed[n & mask]:                  # the sampled, timed path
                return call_timed(runner, table, {...})
            at = 0
            try:
                h0(runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs)
                at = 1
                h1(runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs)
            except Exception as exc:
                failed(at, exc, runner, {...})   # the hook's policy, then the hooks after it

    A loop over the table would cost, per hook, the loop step and unpacking the keyword dict
    again — about as much as the default hooks' own work at ``before/after_train_iter``.
    ``env``: ``counts`` (mount point -> calls), ``runner_ref``, ``timed`` and ``mask``,
    ``call_timed(runner, table, kwargs)``, ``failed_at(table)`` -> ``failed(i, exc, runner,
    kwargs)``."""
    names = mount_arguments(mount)
    params = ", ".join(f"{n}=None" for n in names)
    passed = ", ".join(["runner"] + [f"{n}={n}" for n in names])
    as_dict = "{" + ", ".join(f"{n!r}: {n}" for n in names) + "}"
    lines = [f"def {mount}({params}):", f"    n = counts[{mount!r}] = counts[{mount!r}] + 1"]
    if table:
        lines += [
            "    runner = runner_ref()",
            "    if timed[n & mask]:",
            f"        return call_timed(runner, table, {as_dict})",
            "    at = 0",
            "    try:",
        ]
        for i in range(len(table)):
            if i:
                lines.append(f"        at = {i}")
            lines.append(f"        h{i}({passed})")
        lines += ["    except Exception as exc:", f"        failed(at, exc, runner, {as_dict})"]
    namespace: dict[str, Any] = {f"h{i}": slot.method for i, slot in enumerate(table)}
    namespace.update(env, table=table, failed=env["failed_at"](table))
    exec(compile("\n".join(lines), f"<hook dispatch: {mount}>", "exec"), namespace)
    return namespace[mount]


def without_arguments(method: Callable[[], None]) -> Callable[..., None]:
    """An iMIX-style mount point (``def after_train_iter(self)``) as the dispatcher calls it."""

    def call(runner: RunnerAPI, **kwargs: Any) -> None:
        method()

    call.__qualname__ = getattr(method, "__qualname__", "imix_mount_point")
    return call
