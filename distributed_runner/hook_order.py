"""Hook order: priority, then registration, refined by ``before``/``after`` constraints.

``before=['checkpoint']`` / ``after=['ema']`` (registered names) order hooks *inside* one priority
(a stable topological sort). A constraint that contradicts the priorities, names an unknown hook
or closes a cycle is a one-line error naming the config key.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Sequence

from hooks.priority import priority_name

from .errors import ConfigError, did_you_mean

if TYPE_CHECKING:
    from .dispatch import HookEntry


def names_of(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ConfigError(key, "must be a hook name or a list of hook names, e.g. ['ema']")


def order_entries(entries: Sequence[HookEntry], strict: bool = True,
                  strict_for: HookEntry | None = None) -> list[HookEntry]:
    """Priority order, refined by ``before``/``after`` constraints (a stable topological sort).

    ``strict=False`` ignores constraints naming hooks not registered yet (registration is
    incremental; the final check is strict); ``strict_for`` checks only that entry's names.
    """
    by_name = {e.name: e for e in entries}
    succ: dict[str, set[str]] = {e.name: set() for e in entries}
    for e in entries:
        for attr, pairs in (("after", [(o, e.name) for o in e.after]),
                            ("before", [(e.name, o) for o in e.before])):
            for first, then in pairs:
                other = then if first == e.name else first
                if other not in by_name:
                    if strict or e is strict_for:
                        raise ConfigError(f"{e.key}.{attr}", f"no hook named {other!r}"
                                          f"{did_you_mean(other, list(by_name))}; registered: "
                                          f"{', '.join(by_name)}")
                    continue
                a, b = by_name[first], by_name[then]
                if a.priority > b.priority:
                    raise ConfigError(f"{e.key}.{attr}", f"{a.name!r} ({priority_name(a.priority)}"
                                      f") cannot run before {b.name!r} ({priority_name(b.priority)})"
                                      f": constraints only order hooks of equal priority; change "
                                      f"a priority instead")
                succ[first].add(then)
    indegree = {n: 0 for n in by_name}
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
        raise ConfigError(f"{by_name[cycle[0]].key}.before/after",
                          f"ordering constraints form a cycle: {' -> '.join(cycle)}; "
                          f"remove one of them")
    return ordered


def _find_cycle(succ: dict[str, set[str]]) -> list[str]:
    start = next(iter(succ))
    path, seen = [start], {start: 0}
    while True:
        nxt = sorted(m for m in succ[path[-1]] if m in succ)[0]
        if nxt in seen:
            return path[seen[nxt]:] + [nxt]
        seen[nxt] = len(path)
        path.append(nxt)
