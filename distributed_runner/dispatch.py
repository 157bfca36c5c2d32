"""Hook dispatch: who runs at which mount point, decided once at registration.

For every mount point the dispatcher keeps the ordered tuple of ``(bound method, slot)`` of the
hooks that override it, and a generated caller (:mod:`distributed_runner.call_plan`) that calls
exactly those hooks: no ``getattr``/``hasattr`` per call and no cost for hooks that do not
implement it (50 registered hooks of which 2 implement a mount point cost what 2 cost). The
callers are rebuilt whenever the tables change; the loops hold ``callers`` and call them directly.

This module is the one place that calls hooks, so three cross-cutting policies live here:

* **Order.** Priority value ascending, then registration order; ``before=['checkpoint']`` /
  ``after=['ema']`` (registered names) refine the order *inside* one priority. A constraint that
  contradicts the priorities, names an unknown hook or closes a cycle is a one-line error.
* **Timing, always on, sampled.** Every mount point call is counted. The first
  :data:`TIME_FIRST` calls of each mount point, and after that about one in
  :data:`TIME_EVERY` (a fixed pseudo-random pattern, so a hook that is slow every 10th iteration is
  not aliased), add each hook's wall time to its (hook, mount point) slot — one
  ``perf_counter_ns`` read per hook. A slot's time is its timed total scaled by calls / timed
  calls: an estimate, exact for mount points called at most TIME_FIRST times. Untimed calls cost
  the hook calls and nothing else — at several calls per iteration, a clock read per hook call
  was a measurable part of the loop's own cost. Times are inclusive: a checkpoint hook's time
  includes the ``before_save_checkpoint`` hooks it triggers.
* **Error policy.** ``on_error`` per hook (config key, else the class attribute, else ``'raise'``):
  ``'raise'`` re-raises with a note naming the hook and mount point; ``'warn'`` logs the first
  failure of each (hook, mount point) with its traceback, counts the rest and goes on;
  ``'disable'`` logs once and removes the hook from every table on this rank. ``disable`` is
  local to the rank that failed: do not use it for a hook that runs collectives.
"""
from __future__ import annotations

import contextlib
import logging
import random
import re
import weakref
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any, Callable, Iterator

from hooks.extension_points import EXTENSION_POINTS, CheckpointSaver, SinkProvider, StepGuard
from hooks.hook import ADDED_MOUNT_POINTS, MOUNT_POINTS, Hook, imix_style_mounts, overrides
from hooks.priority import get_priority, priority_name

from .call_plan import Callers, compile_caller
from .errors import ArgumentError, CheckpointWriteError, ConfigError, did_you_mean
from .hook_order import names_of, order_entries
from .log import LOGGER_NAME

_LOOKS_LIKE_MOUNT_POINT = re.compile(r"^(before|after)_")
TIME_FIRST = 16
TIME_EVERY = 16
_PATTERN_BITS = 12  # a pattern of 4096 calls, about 1 in TIME_EVERY set
_RANDOM = random.Random(0)
_TIMED = bytes(i <= TIME_FIRST or _RANDOM.random() < 1 / TIME_EVERY
               for i in range(1 << _PATTERN_BITS))  # call n is timed when _TIMED[n & mask]
_PATTERN_MASK = (1 << _PATTERN_BITS) - 1
ERROR_POLICIES = ("raise", "warn", "disable")
_log = logging.getLogger(LOGGER_NAME)


@dataclass
class HookEntry:
    """A registered hook: its name in the config, resolved priority, registration index and
    dispatch policies."""

    name: str
    hook: Hook
    priority: int
    index: int
    on_error: str = "raise"
    before: tuple[str, ...] = ()
    after: tuple[str, ...] = ()
    key: str = ""
    disabled: bool = False
    errors: dict[str, int] = field(default_factory=dict)  # mount point -> failures
    imix_mounts: frozenset[str] = frozenset()  # mount points written iMIX's way, no arguments


@dataclass
class HookTiming:
    """Cumulative wall time of one hook at one mount point."""

    name: str
    mount: str
    seconds: float
    calls: int
    errors: int


def _without_arguments(method: Callable[[], None]) -> Callable[..., None]:
    """An iMIX-style mount point (``def after_train_iter(self)``) as the dispatcher calls it."""
    def call(runner: Any, **kwargs: Any) -> None:
        method()
    call.__qualname__ = getattr(method, "__qualname__", "imix_mount_point")
    return call


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
        # Hooks are called with the runner itself (as MMEngine does: attribute access through a
        # proxy costs on every use); the dispatcher holds it weakly, so a runner and its
        # dispatcher do not keep each other alive.
        self._runner_ref = weakref.ref(runner)
        self._entries: list[HookEntry] = []
        self._tables: dict[str, tuple[tuple[Callable, int], ...]] = {m: () for m in MOUNT_POINTS}
        # per (entry, mount point) slot: cumulative nanoseconds and call counts
        self._slots: list[tuple[HookEntry, str]] = []
        self._slot_of: dict[tuple[int, str], int] = {}
        self._ns: list[int] = []
        self._timed: list[int] = []  # per slot: how many of its calls were timed
        self._mount_calls: dict[str, int] = {m: 0 for m in MOUNT_POINTS}
        # mount point -> its generated caller (call_plan.py), made at first use after each
        # change of the tables; the loops call these directly
        self.callers = Callers(self._compile)
        self._env = {"counts": self._mount_calls, "runner_ref": self._runner_ref,
                     "timed": _TIMED, "mask": _PATTERN_MASK, "call_timed": self._call_timed,
                     "failed_at": self._failed_at}
        # per slot: the mount point's call count when the slot entered its table, and when it
        # left it (disabled); calls = (end or current) - start
        self._call_base: list[int] = []
        self._call_end: list[int | None] = []
        # the declared extension points (hooks.extension_points), recomputed with the tables
        self.step_guards: tuple[StepGuard, ...] = ()
        self._extensions: dict[str, tuple[HookEntry, ...]] = {}

    # -- registration --------------------------------------------------------------------------
    def register(self, hook: Hook, name: str, priority: Any = None, key: str | None = None,
                 on_error: str | None = None, before: Any = None, after: Any = None,
                 strict: bool = True) -> None:
        """Add ``hook`` under ``name``; ``priority``/``on_error`` (if given) win over the hook's
        own. ``strict=False`` defers the check of ``before``/``after`` names to :meth:`check`."""
        key = key or name
        if not isinstance(hook, Hook):
            raise ConfigError(key, f"{type(hook).__name__} is not a Hook: subclass hooks.Hook")
        if any(e.name == name for e in self._entries):
            raise ConfigError(key, f"a hook named {name!r} is already registered; give this one "
                                   f"a different name= ")
        check_mount_point_names(hook, key)
        source = priority if priority is not None else getattr(hook, "priority", "NORMAL")
        value = get_priority(source, f"{key}.priority")
        policy = on_error if on_error is not None else getattr(hook, "on_error", "raise")
        if policy not in ERROR_POLICIES:
            raise ConfigError(f"{key}.on_error", f"unknown policy {policy!r}: use "
                                                 f"{', '.join(map(repr, ERROR_POLICIES))}")
        hook.priority = value
        entry = HookEntry(name, hook, value, len(self._entries), policy,
                          names_of(before, f"{key}.before"), names_of(after, f"{key}.after"), key,
                          imix_mounts=imix_style_mounts(hook))
        if entry.imix_mounts:  # iMIX's hooks reach the engine as self.trainer
            hook.trainer = weakref.proxy(self._runner_ref())
        self._entries.append(entry)
        self._rebuild(strict=False, strict_for=entry if strict else None)

    def check(self) -> None:
        """Validate every ordering constraint now that all hooks are registered."""
        self._rebuild(strict=True)

    def _rebuild(self, strict: bool = True, strict_for: HookEntry | None = None) -> None:
        self._entries = order_entries(self._entries, strict, strict_for)
        tables = {}
        for mount in MOUNT_POINTS:
            row = []
            for e in self._entries:
                if e.disabled or not overrides(e.hook, mount):
                    continue
                slot = self._slot_of.get((id(e), mount))
                if slot is None:
                    slot = self._slot_of[(id(e), mount)] = len(self._slots)
                    self._slots.append((e, mount))
                    self._ns.append(0)
                    self._timed.append(0)
                    self._call_base.append(self._mount_calls[mount])
                    self._call_end.append(None)
                method = getattr(e.hook, mount)
                row.append((_without_arguments(method) if mount in e.imix_mounts else method,
                            slot))
            tables[mount] = tuple(row)
        self._tables = tables
        self.callers.clear()  # in place: whoever holds it (the loops) gets the new callers
        live = [e for e in self._entries if not e.disabled]
        self._extensions = {point: tuple(e for e in live if isinstance(e.hook, cls))
                            for point, cls in EXTENSION_POINTS.items()}
        self.step_guards = tuple(e.hook for e in self._extensions["step guard"])

    # -- calling -------------------------------------------------------------------------------
    def _compile(self, mount: str) -> Callable[..., None]:
        return compile_caller(mount, self._tables[mount], self._env)

    def call(self, mount: str, **kwargs: Any) -> None:
        """Run ``mount`` on every hook that implements it, in order — the hot path: one counter
        per call; a clock read per hook only on the timed calls (module docstring)."""
        self.callers[mount](**kwargs)

    def _failed_at(self, table: tuple) -> Callable:
        """For a compiled mount point: the policy of the hook at ``i``, then the hooks after it
        (each still under its own policy), as the plain loop would."""
        def failed(i: int, exc: Exception, runner: Any, kwargs: dict) -> None:
            self._failed(table[i][1], exc)
            for fn, slot in table[i + 1:]:
                try:
                    fn(runner, **kwargs)
                except Exception as later:  # noqa: BLE001 - the hook's policy decides
                    self._failed(slot, later)
        return failed

    def _call_timed(self, runner: Any, table: tuple, kwargs: dict) -> None:
        """One clock read per hook: each hook's time runs from the previous hook's end."""
        ns, timed = self._ns, self._timed
        clock = start = perf_counter_ns()
        for fn, slot in table:
            try:
                fn(runner, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the hook's policy decides
                self._failed(slot, exc)
            clock = perf_counter_ns()
            ns[slot] += clock - start
            timed[slot] += 1
            start = clock

    def _failed(self, slot: int, exc: Exception) -> None:
        entry, mount = self._slots[slot]
        entry.errors[mount] = entry.errors.get(mount, 0) + 1
        where = f"hook {entry.name!r} ({type(entry.hook).__name__}) at {mount}"
        if isinstance(exc, ArgumentError):  # a bad argument found late: name its real config path
            raise exc.under(entry.key) from exc
        if entry.on_error == "raise":
            if not isinstance(exc, CheckpointWriteError):  # going on would never save the run
                exc.add_note(f"raised in {where}; set on_error='warn' in its config to keep "
                             f"training")
            raise exc
        if entry.on_error == "disable":
            _log.warning("%s failed and is disabled for the rest of this run (on_error="
                         "'disable'): %s: %s", where, type(exc).__name__, exc, exc_info=exc)
            entry.disabled = True
            for i, (e, m) in enumerate(self._slots):
                if e is entry:
                    self._call_end[i] = self._mount_calls[m]
            self._rebuild()
        elif entry.errors[mount] == 1:
            _log.warning("%s failed (on_error='warn'; later failures there are only counted): "
                         "%s: %s", where, type(exc).__name__, exc, exc_info=exc)

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
                _log.exception("%s failed while handling an earlier error", after)
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

    def checkpoint_saver(self) -> CheckpointSaver | None:
        """The first :class:`~hooks.extension_points.CheckpointSaver` in call order, or None."""
        savers = self._extensions.get("checkpoint on request", ())
        return savers[0].hook if savers else None

    def sink_specs(self) -> list[tuple[str, Any]]:
        """``(config key of the sink, spec)`` for every sink the
        :class:`~hooks.extension_points.SinkProvider` hooks name, in call order."""
        out = []
        for e in self._extensions.get("log sinks", ()):
            hook: SinkProvider = e.hook  # type: ignore[assignment]
            out += [(f"{e.key}.sinks[{i}]", spec) for i, spec in enumerate(hook.sink_specs)]
        return out

    def timings(self) -> list[HookTiming]:
        """Cumulative time per (hook, mount point) that was called, slowest first."""
        out = []
        for i, (e, mount) in enumerate(self._slots):
            calls = self._calls(i)
            if calls or e.errors:
                out.append(HookTiming(e.name, mount, self._seconds(i, calls), calls,
                                      e.errors.get(mount, 0)))
        return sorted(out, key=lambda t: -t.seconds)

    def _calls(self, slot: int) -> int:
        end = self._call_end[slot]
        mount = self._slots[slot][1]
        return (self._mount_calls[mount] if end is None else end) - self._call_base[slot]

    def _seconds(self, slot: int, calls: int) -> float:
        """The slot's timed nanoseconds scaled to all its calls (an estimate when sampled)."""
        timed = self._timed[slot]
        return self._ns[slot] / 1e9 * (calls / timed if timed else 0.0)

    def seconds_by_hook(self) -> dict[str, float]:
        """Cumulative time per hook over all its mount points (estimated; module docstring)."""
        total: dict[str, float] = {}
        for i, (e, _) in enumerate(self._slots):
            total[e.name] = total.get(e.name, 0.0) + self._seconds(i, self._calls(i))
        return total

    def plan(self) -> dict[str, list[tuple[str, int]]]:
        """Mount point -> [(hook name, priority)] in call order, only non-empty mount points."""
        plan: dict[str, list[tuple[str, int]]] = {}
        for mount in MOUNT_POINTS:
            calls = self._tables[mount]
            if calls:
                plan[mount] = [(self._slots[slot][0].name, self._slots[slot][0].priority)
                               for _, slot in calls]
        return plan

    def plan_text(self) -> str:
        """The hook plan as the runner logs it and ``drun hooks`` prints it."""
        width = max((len(e.name) for e in self._entries), default=4)
        lines = ["Hooks (in call order):"]
        for e in self._entries:
            extra = [f"on_error={e.on_error}"] if e.on_error != "raise" else []
            extra += [f"after={','.join(e.after)}"] if e.after else []
            extra += [f"before={','.join(e.before)}"] if e.before else []
            extra += ["DISABLED"] if e.disabled else []
            lines.append(f"  {e.name:<{width}}  {type(e.hook).__name__:<24} "
                         f"{priority_name(e.priority):<13} {' '.join(extra)}".rstrip())
        lines.append("Mount points:")
        for mount, calls in self.plan().items():
            added = "  [added to MMEngine's]" if mount in ADDED_MOUNT_POINTS else ""
            lines.append(f"  {mount:<22} " + " -> ".join(f"{n} ({p})" for n, p in calls) + added)
        points = [(point, entries) for point, entries in self._extensions.items() if entries]
        if points:
            lines.append("Extension points:")
        for point, entries in points:
            if point == "log sinks":
                names = [spec if isinstance(spec, str) else
                         spec.get("type", "?") if isinstance(spec, dict) else type(spec).__name__
                         for _, spec in self.sink_specs()]
                text = f"{', '.join(e.name for e in entries)}: {', '.join(map(str, names))}"
            else:
                text = " -> ".join(e.name for e in entries)
            lines.append(f"  {point:<22} {text}")
        return "\n".join(lines)
