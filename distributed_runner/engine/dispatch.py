"""Hook dispatch: who runs at which mount point, decided once at registration.

For every mount point the dispatcher keeps the ordered tuple of :class:`Slot` s — one per hook
that implements it, holding the method to call and what calling it cost — and a caller generated
from that table (:func:`compile_caller`) that calls exactly those hooks: no ``getattr`` per call
and no cost for hooks that do not implement it (50 registered hooks of which 2 implement a mount
point cost what 2 cost). :meth:`HookDispatcher.call_reference` is the same caller written as a
plain loop; the generated one must behave exactly like it (tests/unit/test_dispatch_reference.py
checks that). The callers are rebuilt whenever the tables change; the loops hold ``callers`` and
call them directly. What one call of a mount point runs is all in this file; the reports (plan,
timings) are in :mod:`distributed_runner.engine.hook_report`.

The dispatcher is the one place that calls hooks' *mount points*, so three policies live here:

* **Order.** Priority value ascending, then registration order; ``before=['checkpoint']`` /
  ``after=['ema']`` (registered names) refine the order *inside* one priority
  (:mod:`distributed_runner.engine.hook_order`). A constraint that contradicts the priorities, names
  an unknown hook or closes a cycle is a one-line error.
* **Timing, always on, sampled.** Every mount point call is counted. The first
  :data:`TIME_FIRST` calls of each mount point, and after that about one in
  :data:`TIME_EVERY` (a fixed pseudo-random pattern, so a hook that is slow every 10th iteration is
  not aliased), add each hook's wall time to its slot — one ``perf_counter_ns`` read per hook. A
  slot's time is its timed total scaled by calls / timed calls: an estimate, exact for mount points
  called at most TIME_FIRST times. Untimed calls cost the hook calls and nothing else. Times are
  inclusive: a checkpoint hook's time includes the ``before_save_checkpoint`` hooks it triggers.
* **Error policy.** ``on_error`` per hook (config key, else the class attribute, else ``'raise'``):
  ``'raise'`` re-raises with a note naming the hook and mount point; ``'warn'`` logs the first
  failure of each (hook, mount point) with its traceback, counts the rest and goes on;
  ``'disable'`` logs once and removes the hook from every table on this rank. ``disable`` is
  local to the rank that failed: do not use it for a hook that runs collectives. The hooks after a
  failed one are still called.

Hooks are also called *outside* the dispatcher, neither timed nor under ``on_error`` (a failure
propagates): the step guards of :mod:`distributed_runner.engine.extension_points` (by the loop's
step: their verdicts, combined over ranks, decide the step, so none may be skipped on one rank),
``save_on_request`` (by ``Runner.save_requested_checkpoint``, on every rank: a requested or
preemption checkpoint is written or fails loudly) and ``state_dict``/``load_state_dict`` (by the
checkpoint code, through ``Runner.stateful_hooks()``: a checkpoint without a hook's state would
resume wrongly).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import random
import weakref
from collections.abc import Callable, Iterator
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, cast

from distributed_runner.core.errors import ArgumentError, CheckpointWriteError, ConfigError
from distributed_runner.core.log import LOGGER_NAME
from distributed_runner.engine import hook_report
from distributed_runner.engine.extension_points import (
    EXTENSION_POINTS,
    CheckpointSaver,
    SinkProvider,
    StepGuard,
)
from distributed_runner.engine.hook import (
    MOUNT_POINTS,
    Hook,
    check_mount_point_names,
    imix_style_mounts,
    overrides,
)
from distributed_runner.engine.hook_order import HookEntry, names_of, order_entries
from distributed_runner.engine.hook_report import HookTiming
from distributed_runner.engine.priority import get_priority

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI

__all__ = [
    "TIME_EVERY",
    "TIME_FIRST",
    "HookDispatcher",
    "HookEntry",
    "HookTiming",
    "Slot",
    "compile_caller",
]

ERROR_POLICIES = ("raise", "warn", "disable")
TIME_FIRST = 16  # the first calls of each mount point are all timed
TIME_EVERY = 16  # after them, about one call in this many
_PATTERN_BITS = 12  # a pattern of 4096 calls, about 1 in TIME_EVERY set
_RANDOM = random.Random(0)
_TIMED = bytes(
    i <= TIME_FIRST or _RANDOM.random() < 1 / TIME_EVERY for i in range(1 << _PATTERN_BITS)
)  # call n is timed when _TIMED[n & mask]
_PATTERN_MASK = (1 << _PATTERN_BITS) - 1

_log = logging.getLogger(LOGGER_NAME)


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


class HookDispatcher:
    """Ordered hooks and per-mount-point call tables for one runner.

    ``generated=False`` makes every caller :meth:`call_reference` (the plain loop) instead of the
    generated function: slower, the same behaviour; for tests and for debugging dispatch itself.
    """

    def __init__(self, runner: RunnerAPI, generated: bool = True) -> None:
        # Hooks are called with the runner itself (as MMEngine does: attribute access through a
        # proxy costs on every use); the dispatcher holds it weakly, so a runner and its
        # dispatcher do not keep each other alive.
        self._runner_ref = weakref.ref(runner)
        self._entries: list[HookEntry] = []
        self._tables: dict[str, tuple[Slot, ...]] = dict.fromkeys(MOUNT_POINTS, ())
        self._slots: list[Slot] = []  # every slot ever made, in creation order
        self._slot_of: dict[tuple[int, str], Slot] = {}  # (id(entry), mount point) -> slot
        self._mount_calls: dict[str, int] = dict.fromkeys(MOUNT_POINTS, 0)
        # mount point -> its caller, made when first used after a change; the loops call these
        self.callers = Callers(self._compile if generated else self._reference)
        self._env = {
            "counts": self._mount_calls,
            "runner_ref": self._runner_ref,
            "timed": _TIMED,
            "mask": _PATTERN_MASK,
            "call_timed": self._call_timed,
            "failed_at": self._failed_at,
        }
        # the declared extension points (extension_points.py), recomputed with the tables
        self.step_guards: tuple[StepGuard, ...] = ()
        self._extensions: dict[str, tuple[HookEntry, ...]] = {}

    # -- registration --------------------------------------------------------------------------
    def register(
        self,
        hook: Hook,
        name: str,
        priority: Any = None,
        key: str | None = None,
        on_error: str | None = None,
        before: Any = None,
        after: Any = None,
        strict: bool = True,
    ) -> None:
        """Add ``hook`` under ``name``; ``priority``/``on_error`` (if given) win over the hook's
        own. ``strict=False`` defers the check of ``before``/``after`` names to :meth:`check`."""
        key = key or name
        if not isinstance(hook, Hook):
            raise ConfigError(key, f"{type(hook).__name__} is not a Hook: subclass hooks.Hook")
        if any(e.name == name for e in self._entries):
            raise ConfigError(
                key,
                f"a hook named {name!r} is already registered; give this one a different name= ",
            )
        check_mount_point_names(hook, key)
        source = priority if priority is not None else getattr(hook, "priority", "NORMAL")
        value = get_priority(source, f"{key}.priority")
        policy = on_error if on_error is not None else getattr(hook, "on_error", "raise")
        if policy not in ERROR_POLICIES:
            raise ConfigError(
                f"{key}.on_error",
                f"unknown policy {policy!r}: use {', '.join(map(repr, ERROR_POLICIES))}",
            )
        hook.priority = value
        entry = HookEntry(
            name,
            hook,
            value,
            len(self._entries),
            policy,
            names_of(before, f"{key}.before"),
            names_of(after, f"{key}.after"),
            key,
            imix_mounts=imix_style_mounts(hook),
        )
        if entry.imix_mounts:  # iMIX's hooks reach the engine as self.trainer
            hook.trainer = weakref.proxy(self._runner_ref())  # type: ignore[attr-defined]
        self._entries.append(entry)
        self._rebuild(strict=False, strict_for=entry if strict else None)

    def check(self) -> None:
        """Validate every ordering constraint now that all hooks are registered."""
        self._rebuild(strict=True)

    def _slot(self, entry: HookEntry, mount: str) -> Slot:
        """The slot of ``entry`` at ``mount``, made on first use (its calls count from then), its
        method looked up again at every rebuild of the tables."""
        method = getattr(entry.hook, mount)
        if mount in entry.imix_mounts:
            method = without_arguments(method)
        slot = self._slot_of.get((id(entry), mount))
        if slot is None:
            slot = self._slot_of[(id(entry), mount)] = Slot(
                entry, mount, method, self._mount_calls[mount]
            )
            self._slots.append(slot)
        slot.method = method
        return slot

    def _rebuild(self, strict: bool = True, strict_for: HookEntry | None = None) -> None:
        self._entries = order_entries(self._entries, strict, strict_for)
        live = [e for e in self._entries if not e.disabled]
        self._tables = {
            mount: tuple(self._slot(e, mount) for e in live if overrides(e.hook, mount))
            for mount in MOUNT_POINTS
        }
        self.callers.clear()  # in place: whoever holds it (the loops) gets the new callers
        self._extensions = {
            point: tuple(e for e in live if isinstance(e.hook, cls))
            for point, cls in EXTENSION_POINTS.items()
        }
        self.step_guards = tuple(cast(StepGuard, e.hook) for e in self._extensions["step guard"])

    # -- calling -------------------------------------------------------------------------------
    def _compile(self, mount: str) -> Callable[..., None]:
        return compile_caller(mount, self._tables[mount], self._env)

    def _reference(self, mount: str) -> Callable[..., None]:
        return functools.partial(self.call_reference, mount)

    def call(self, mount: str, **kwargs: Any) -> None:
        """Run ``mount`` on every hook that implements it, in order — the hot path: one counter
        per call; a clock read per hook only on the timed calls (module docstring)."""
        self.callers[mount](**kwargs)

    def call_reference(self, mount: str, **kwargs: Any) -> None:
        """What a generated caller does (:func:`compile_caller`), as a plain loop: count the call;
        on a sampled call time each hook; call each hook with every argument of the mount
        point's signature (None when not given); apply a failed hook's policy and go on with the
        hooks after it."""
        names = mount_arguments(mount)
        unexpected = sorted(set(kwargs) - set(names))
        if unexpected:
            raise TypeError(f"{mount}() got an unexpected keyword argument {unexpected[0]!r}")
        n = self._mount_calls[mount] = self._mount_calls[mount] + 1
        table = self._tables[mount]
        if not table:
            return
        runner = self._runner_ref()
        assert runner is not None, "the Runner of this dispatcher is gone"
        arguments = {name: kwargs.get(name) for name in names}
        if _TIMED[n & _PATTERN_MASK]:
            self._call_timed(runner, table, arguments)
            return
        for slot in table:
            try:
                slot.method(runner, **arguments)
            except Exception as exc:  # noqa: BLE001 - the hook's policy decides
                self._failed(slot, exc)

    def _failed_at(self, table: tuple[Slot, ...]) -> Callable[..., None]:
        """For a generated caller: the policy of the hook at ``i``, then the hooks after it
        (each still under its own policy), as :meth:`call_reference` does."""

        def failed(i: int, exc: Exception, runner: RunnerAPI, kwargs: dict) -> None:
            self._failed(table[i], exc)
            for slot in table[i + 1 :]:
                try:
                    slot.method(runner, **kwargs)
                except Exception as later:  # noqa: BLE001 - the hook's policy decides
                    self._failed(slot, later)

        return failed

    def _call_timed(self, runner: RunnerAPI, table: tuple[Slot, ...], kwargs: dict) -> None:
        """One clock read per hook: each hook's time runs from the previous hook's end."""
        clock = start = perf_counter_ns()
        for slot in table:
            try:
                slot.method(runner, **kwargs)
            except Exception as exc:  # noqa: BLE001 - the hook's policy decides
                self._failed(slot, exc)
            clock = perf_counter_ns()
            slot.ns += clock - start
            slot.timed += 1
            start = clock

    def _failed(self, slot: Slot, exc: Exception) -> None:
        """Apply the error policy of ``slot``'s hook to ``exc`` (module docstring)."""
        entry, mount = slot.entry, slot.mount
        entry.errors[mount] = entry.errors.get(mount, 0) + 1
        where = f"hook {entry.name!r} ({type(entry.hook).__name__}) at {mount}"
        if isinstance(exc, ArgumentError):  # a bad argument found late: name its real config path
            raise exc.under(entry.key) from exc
        if entry.on_error == "raise":
            if not isinstance(exc, CheckpointWriteError):  # going on would never save the run
                exc.add_note(
                    f"raised in {where}; set on_error='warn' in its config to keep training"
                )
            raise exc
        if entry.on_error == "disable":
            _log.warning(
                "%s failed and is disabled for the rest of this run (on_error='disable'): %s: %s",
                where,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            entry.disabled = True
            for other in self._slots:
                if other.entry is entry:
                    other.call_end = self._mount_calls[other.mount]
            self._rebuild()
        elif entry.errors[mount] == 1:
            _log.warning(
                "%s failed (on_error='warn'; later failures there are only counted): %s: %s",
                where,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )

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
            except Exception:  # noqa: BLE001 - the earlier error is the one to raise
                _log.exception("%s failed while handling an earlier error", after)
            raise
        self.call(after)

    # -- what the Runner asks --------------------------------------------------------------------
    @property
    def entries(self) -> list[HookEntry]:
        return list(self._entries)

    def hook_named(self, name: str) -> Hook | None:
        return next((e.hook for e in self._entries if e.name == name), None)

    def checkpoint_saver(self) -> CheckpointSaver | None:
        """The first :class:`~distributed_runner.engine.extension_points.CheckpointSaver` in call
        order, or None."""
        savers = self._extensions.get("checkpoint on request", ())
        return savers[0].hook if savers else None  # type: ignore[return-value]

    def sink_specs(self) -> list[tuple[str, Any]]:
        """``(config key of the sink, spec)`` for every sink the
        :class:`~distributed_runner.engine.extension_points.SinkProvider` hooks name, in call
        order."""
        out = []
        for e in self._extensions.get("log sinks", ()):
            hook: SinkProvider = e.hook  # type: ignore[assignment]
            out += [(f"{e.key}.sinks[{i}]", spec) for i, spec in enumerate(hook.sink_specs)]
        return out

    # -- reports (distributed_runner.engine.hook_report) ---------------------------------------
    def timings(self) -> list[HookTiming]:
        """Cumulative time per (hook, mount point) that was called, slowest first."""
        return hook_report.timings(self._slots, self._mount_calls)

    def seconds_by_hook(self) -> dict[str, float]:
        """Cumulative time per hook over all its mount points (estimated; module docstring)."""
        return hook_report.seconds_by_hook(self._slots, self._mount_calls)

    def plan(self) -> dict[str, list[tuple[str, int]]]:
        """Mount point -> [(hook name, priority)] in call order, only non-empty mount points."""
        return hook_report.plan(self._tables)

    def plan_text(self) -> str:
        """The hook plan as the runner logs it and ``drun hooks`` prints it."""
        return hook_report.plan_text(
            self._entries, self._tables, self._extensions, self.sink_specs()
        )
