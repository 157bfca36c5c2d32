"""Hook dispatch: who runs at which mount point, decided once at registration.

For every mount point the dispatcher keeps the ordered tuple of bound methods of the hooks that
override it. Calling a mount point walks that tuple: no ``getattr``/``hasattr`` per call and no cost
for hooks that do not implement it (50 registered hooks of which 2 implement a mount point cost
what 2 cost). Order: priority value ascending, then registration order.

This module is the one place that calls hooks; per-hook timing, error policy and ordering
constraints belong here.
"""
from __future__ import annotations

import contextlib
import logging
import re
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from hooks.hook import MOUNT_POINTS, Hook, overrides
from hooks.priority import get_priority, priority_name

from .errors import ConfigError, did_you_mean

_LOOKS_LIKE_MOUNT_POINT = re.compile(r"^(before|after)_")


@dataclass
class HookEntry:
    """A registered hook: its name in the config, resolved priority and registration index."""

    name: str
    hook: Hook
    priority: int
    index: int


def check_mount_point_names(hook: Hook, key: str) -> None:
    """Reject a method whose name looks like a mount point but is not one.

    ``after_train_iteration`` would otherwise be silently never called — the classic hook bug.
    """
    for cls in type(hook).__mro__:
        if cls is Hook or cls is object:
            continue
        for attr, value in vars(cls).items():
            if (callable(value) and _LOOKS_LIKE_MOUNT_POINT.match(attr)
                    and attr not in MOUNT_POINTS):
                raise ConfigError(key, f"{type(hook).__name__}.{attr} is not a mount point"
                                       f"{did_you_mean(attr, MOUNT_POINTS)}; rename it, or "
                                       f"prefix it with '_' if it is a helper")


class HookDispatcher:
    """Ordered hooks and per-mount-point call tables for one runner."""

    def __init__(self, runner: Any) -> None:
        # Hooks are called with the runner; hold it weakly so a runner and its hooks do not keep
        # each other alive.
        self._runner = weakref.proxy(runner)
        self._entries: list[HookEntry] = []
        self._tables: dict[str, tuple[Callable, ...]] = {m: () for m in MOUNT_POINTS}

    # -- registration --------------------------------------------------------------------------
    def register(self, hook: Hook, name: str, priority: Any = None, key: str | None = None) -> None:
        """Add ``hook`` under ``name``; ``priority`` (if given) wins over the hook's own."""
        key = key or name
        if not isinstance(hook, Hook):
            raise ConfigError(key, f"{type(hook).__name__} is not a Hook: subclass hooks.Hook")
        if any(e.name == name for e in self._entries):
            raise ConfigError(key, f"a hook named {name!r} is already registered; give this one "
                                   f"a different name= ")
        check_mount_point_names(hook, key)
        source = priority if priority is not None else getattr(hook, "priority", "NORMAL")
        value = get_priority(source, f"{key}.priority")
        hook.priority = value
        self._entries.append(HookEntry(name, hook, value, len(self._entries)))
        self._rebuild()

    def _rebuild(self) -> None:
        ordered = sorted(self._entries, key=lambda e: (e.priority, e.index))
        self._entries = ordered
        self._tables = {
            mount: tuple(getattr(e.hook, mount) for e in ordered if overrides(e.hook, mount))
            for mount in MOUNT_POINTS
        }

    # -- calling -------------------------------------------------------------------------------
    def call(self, mount: str, **kwargs: Any) -> None:
        """Run ``mount`` on every hook that implements it, in order."""
        runner = self._runner
        for fn in self._tables[mount]:
            fn(runner, **kwargs)

    @contextlib.contextmanager
    def bracket(self, before: str, after: str) -> Iterator[None]:
        """Call ``before``, run the body, call ``after`` — also when the body raises.

        If ``after`` itself fails while an error is propagating, that failure is logged and the
        original error is the one raised (a flushing sink must not hide why training died).
        """
        self.call(before)
        try:
            yield
        except BaseException:
            try:
                self.call(after)
            except Exception:
                logging.getLogger("distributed_runner").exception(
                    "%s failed while handling an earlier error", after)
            raise
        self.call(after)

    # -- introspection -------------------------------------------------------------------------
    @property
    def entries(self) -> list[HookEntry]:
        return list(self._entries)

    def hook_named(self, name: str) -> Hook | None:
        for e in self._entries:
            if e.name == name:
                return e.hook
        return None

    def plan(self) -> dict[str, list[tuple[str, int]]]:
        """Mount point -> [(hook name, priority)] in call order, only non-empty mount points."""
        by_hook = {id(e.hook): e for e in self._entries}
        plan: dict[str, list[tuple[str, int]]] = {}
        for mount in MOUNT_POINTS:
            calls = self._tables[mount]
            if calls:
                plan[mount] = [(by_hook[id(fn.__self__)].name, by_hook[id(fn.__self__)].priority)
                               for fn in calls]
        return plan

    def plan_text(self) -> str:
        """The hook plan as the runner logs it and ``drun hooks`` prints it."""
        width = max((len(e.name) for e in self._entries), default=4)
        lines = ["Hooks (in priority order):"]
        for e in self._entries:
            lines.append(f"  {e.name:<{width}}  {type(e.hook).__name__:<24} "
                         f"{priority_name(e.priority)}")
        lines.append("Mount points:")
        for mount, calls in self.plan().items():
            lines.append(f"  {mount:<22} " + " -> ".join(f"{n} ({p})" for n, p in calls))
        return "\n".join(lines)
