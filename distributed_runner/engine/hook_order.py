"""Registered hooks (:class:`HookEntry`) and their order: priority, then registration, refined
by ``before``/``after`` constraints.

``before=['checkpoint']`` / ``after=['ema']`` (registered names) order hooks *inside* one priority
(a stable topological sort). A constraint that contradicts the priorities, names an unknown hook
or closes a cycle is a one-line error naming the config key.

:class:`HookEntry` lives here, below the dispatcher, because ordering is the first thing done with
it: the dispatcher (:mod:`distributed_runner.engine.dispatch`) and the report
(:mod:`distributed_runner.engine.hook_report`) import it from here, and this module imports neither.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from distributed_runner.core.errors import ConfigError, did_you_mean
from distributed_runner.engine.hook import Hook
from distributed_runner.engine.priority import priority_name


@dataclass
class HookEntry:
    """A registered hook: its name in the config, resolved priority, registration index, ordering
    constraints and dispatch policies (``on_error``; ``disabled`` once that policy removed it)."""

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


def names_of(value: Any, key: str) -> tuple[str, ...]:
    """A ``before``/``after`` value (a name or a list of names) as a tuple of names."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(key, "must be a hook name or a list of hook names, e.g. ['ema']")


def order_entries(
    entries: Sequence[HookEntry], strict: bool = True, strict_for: HookEntry | None = None
) -> list[HookEntry]:
    """Priority order, refined by ``before``/``after`` constraints (a stable topological sort).

    ``strict=False`` ignores constraints naming hooks not registered yet (registration is
    incremental; the final check is strict); ``strict_for`` checks only that entry's names.
    """
    by_name = {e.name: e for e in entries}
    succ: dict[str, set[str]] = {e.name: set() for e in entries}
    for e in entries:
        for attr, pairs in (
            ("after", [(o, e.name) for o in e.after]),
            ("before", [(e.name, o) for o in e.before]),
        ):
            for first, then in pairs:
                other = then if first == e.name else first
                if other not in by_name:
                    if strict or e is strict_for:
                        raise ConfigError(
                            f"{e.key}.{attr}",
                            f"no hook named {other!r}"
                            f"{did_you_mean(other, list(by_name))}; registered: "
                            f"{', '.join(by_name)}",
                        )
                    continue
                a, b = by_name[first], by_name[then]
                if a.priority > b.priority:
                    raise ConfigError(
                        f"{e.key}.{attr}",
                        f"{a.name!r} ({priority_name(a.priority)}) cannot run "
                        f"before {b.name!r} ({priority_name(b.priority)}): "
                        f"constraints only order hooks of equal priority; change "
                        f"a priority instead",
                    )
                succ[first].add(then)
    indegree = dict.fromkeys(by_name, 0)
    for n in succ:
        for m in succ[n]:
            indegree[m] += 1
    ready = [(e.priority, e.index, e.name) for e in entries if indegree[e.name] == 0]
    heapq.heapify(ready)
    ordered: list[HookEntry] = []
    while ready:
        *_, name = heapq.heappop(ready)
        ordered.append(by_name[name])
        for m in succ[name]:
            indegree[m] -= 1
            if indegree[m] == 0:
                heapq.heappush(ready, (by_name[m].priority, by_name[m].index, m))
    if len(ordered) < len(entries):
        cycle = _find_cycle({n: s for n, s in succ.items() if indegree[n] > 0})
        raise ConfigError(
            f"{by_name[cycle[0]].key}.before/after",
            f"ordering constraints form a cycle: {' -> '.join(cycle)}; remove one of them",
        )
    return ordered


def _find_cycle(succ: dict[str, set[str]]) -> list[str]:
    """One cycle of ``succ`` (every node in it has a successor in it), for the error message."""
    start = next(iter(succ))
    path, seen = [start], {start: 0}
    while True:
        nxt = sorted(m for m in succ[path[-1]] if m in succ)[0]
        if nxt in seen:
            return [*path[seen[nxt] :], nxt]
        seen[nxt] = len(path)
        path.append(nxt)
