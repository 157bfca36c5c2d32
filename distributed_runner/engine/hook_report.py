"""What the dispatcher reports about its hooks: the plan (who runs where) and the time they took.

Nothing here runs on the training hot path: the Runner logs the plan once, ``drun hooks`` prints
it, LoggerHook reads the timings once per logged window and at the end of training. It lives apart
from :mod:`distributed_runner.engine.dispatch` so that the dispatcher's file holds only what one
call of a mount point runs; :class:`~distributed_runner.engine.dispatch.HookDispatcher` keeps thin
methods (``plan_text()``, ``timings()``, ...) that call these functions with its tables.

The functions read the dispatcher's per-(hook, mount point) slots through :class:`SlotRecord`
(the attributes a slot has; :class:`~distributed_runner.engine.dispatch.Slot` is one), so this
module does not import the dispatcher. Timing semantics (sampled, scaled to all calls) are explained
in the dispatcher's docstring.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from distributed_runner.engine.hook import ADDED_MOUNT_POINTS, MOUNT_POINTS
from distributed_runner.engine.hook_order import HookEntry
from distributed_runner.engine.priority import priority_name


class SlotRecord(Protocol):
    """What the report reads of a dispatcher slot (one hook at one mount point)."""

    entry: HookEntry
    mount: str
    ns: int  # nanoseconds of the timed calls
    timed: int  # how many calls were timed
    call_base: int  # the mount point's call count when the slot entered its table
    call_end: int | None  # ... and when it left it (its hook disabled), else None


@dataclass
class HookTiming:
    """Cumulative wall time of one hook at one mount point."""

    name: str
    mount: str
    seconds: float
    calls: int
    errors: int


def slot_calls(slot: SlotRecord, mount_calls: Mapping[str, int]) -> int:
    """How often the slot's hook was called there: the mount point's calls while it was in the
    table (the dispatcher counts calls per mount point, not per hook, to keep calls cheap)."""
    end = slot.call_end if slot.call_end is not None else mount_calls[slot.mount]
    return end - slot.call_base


def slot_seconds(slot: SlotRecord, calls: int) -> float:
    """The slot's timed nanoseconds scaled to all its calls (an estimate when sampled)."""
    return slot.ns / 1e9 * (calls / slot.timed if slot.timed else 0.0)


def timings(slots: Iterable[SlotRecord], mount_calls: Mapping[str, int]) -> list[HookTiming]:
    """Cumulative time per (hook, mount point) that was called or failed, slowest first."""
    out = []
    for slot in slots:
        calls, entry = slot_calls(slot, mount_calls), slot.entry
        if calls or entry.errors:
            out.append(
                HookTiming(
                    entry.name,
                    slot.mount,
                    slot_seconds(slot, calls),
                    calls,
                    entry.errors.get(slot.mount, 0),
                )
            )
    return sorted(out, key=lambda t: -t.seconds)


def seconds_by_hook(
    slots: Iterable[SlotRecord], mount_calls: Mapping[str, int]
) -> dict[str, float]:
    """Cumulative time per hook name over all its mount points (estimated)."""
    total: dict[str, float] = {}
    for slot in slots:
        name = slot.entry.name
        total[name] = total.get(name, 0.0) + slot_seconds(slot, slot_calls(slot, mount_calls))
    return total


def plan(tables: Mapping[str, Sequence[SlotRecord]]) -> dict[str, list[tuple[str, int]]]:
    """Mount point -> [(hook name, priority)] in call order, only non-empty mount points."""
    return {
        mount: [(s.entry.name, s.entry.priority) for s in tables[mount]]
        for mount in MOUNT_POINTS
        if tables.get(mount)
    }


def _hook_lines(entries: Sequence[HookEntry]) -> list[str]:
    width = max((len(e.name) for e in entries), default=4)
    lines = ["Hooks (in call order):"]
    for e in entries:
        extra = [f"on_error={e.on_error}"] if e.on_error != "raise" else []
        extra += [f"after={','.join(e.after)}"] if e.after else []
        extra += [f"before={','.join(e.before)}"] if e.before else []
        extra += ["DISABLED"] if e.disabled else []
        lines.append(
            f"  {e.name:<{width}}  {type(e.hook).__name__:<24} "
            f"{priority_name(e.priority):<13} {' '.join(extra)}".rstrip()
        )
    return lines


def _sink_name(spec: Any) -> str:
    if isinstance(spec, str):
        return spec
    return str(spec.get("type", "?")) if isinstance(spec, dict) else type(spec).__name__


def plan_text(
    entries: Sequence[HookEntry],
    tables: Mapping[str, Sequence[SlotRecord]],
    extensions: Mapping[str, Sequence[HookEntry]],
    sink_specs: Sequence[tuple[str, Any]],
) -> str:
    """The hook plan as the Runner logs it and ``drun hooks`` prints it: the hooks, who runs at
    each mount point, and the extension points in use (``sink_specs``: the named log sinks)."""
    lines = _hook_lines(entries)
    lines.append("Mount points:")
    for mount, calls in plan(tables).items():
        added = "  [added to MMEngine's]" if mount in ADDED_MOUNT_POINTS else ""
        lines.append(f"  {mount:<22} " + " -> ".join(f"{n} ({p})" for n, p in calls) + added)
    points = [(point, found) for point, found in extensions.items() if found]
    if points:
        lines.append("Extension points:")
    for point, found in points:
        if point == "log sinks":
            names = [_sink_name(spec) for _, spec in sink_specs]
            text = f"{', '.join(e.name for e in found)}: {', '.join(names)}"
        else:
            text = " -> ".join(e.name for e in found)
        lines.append(f"  {point:<22} {text}")
    return "\n".join(lines)


def _marks(entry: HookEntry) -> str:
    """What sets a hook apart in the short plan: a non-default error policy, a disabled hook."""
    marks = [f"on_error={entry.on_error}"] if entry.on_error != "raise" else []
    marks += ["DISABLED"] if entry.disabled else []
    return f" [{', '.join(marks)}]" if marks else ""


def plan_summary(
    entries: Sequence[HookEntry],
    sink_specs: Sequence[tuple[str, Any]],
    where: str | None,
    width: int = 80,
) -> str:
    """The hook plan for the terminal (:mod:`distributed_runner.core.log`): the hooks in call
    order with their priorities, the log sinks, and the file holding the whole plan
    (:func:`plan_text`: every mount point and extension point). ``width`` leaves room for the
    log line's time and level; a path longer than the width stays whole (one can copy it)."""
    hooks = ", ".join(f"{e.name} {priority_name(e.priority)}{_marks(e)}" for e in entries)
    text = f"Hooks in call order: {hooks or 'none'}"
    if sink_specs:
        text += f"; log sinks: {', '.join(_sink_name(spec) for _, spec in sink_specs)}"
    if where:
        text += f". Mount points and extension points: {where}"
    return textwrap.fill(
        text, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False
    )


def timing_summary(rows: Sequence[HookTiming], where: str | None, top: int = 3) -> str:
    """The end-of-training hook time for the terminal: the total, the ``top`` slowest (hook,
    mount point) pairs and any errors, and the file holding the whole table."""
    total = sum(t.seconds for t in rows)
    slowest = ", ".join(f"{t.name}.{t.mount} {t.seconds:.3f} s" for t in rows[:top])
    text = f"Hook time: {total:.3f} s in {len(rows)} (hook, mount point) pairs"
    text += f"; slowest: {slowest}" if slowest else ""
    errors = sum(t.errors for t in rows)
    text += f"; {errors} errors" if errors else ""
    if where:
        text += f". Full table: {where}"
    return text


def timing_table(rows: Sequence[HookTiming]) -> str:
    """The whole end-of-training hook time table, for the run's log file: one row per (hook,
    mount point) with its calls, total, mean and errors."""
    lines = [
        "Hook time (cumulative, inclusive of nested hook calls):",
        f"  {'hook':<20} {'mount point':<24} {'calls':>8} {'total s':>9} {'mean us':>9}"
        f" {'errors':>6}",
    ]
    for t in rows:
        mean = 1e6 * t.seconds / t.calls if t.calls else 0.0
        lines.append(
            f"  {t.name:<20} {t.mount:<24} {t.calls:>8} {t.seconds:>9.3f} "
            f"{mean:>9.1f} {t.errors:>6}"
        )
    return "\n".join(lines)
