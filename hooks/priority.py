"""Hook priorities: lower runs first, equal values keep registration order."""
from __future__ import annotations

from enum import IntEnum
from typing import Union

from distributed_runner.errors import ConfigError, did_you_mean


class Priority(IntEnum):
    """The nine named levels (MMEngine's values)."""

    HIGHEST = 0
    VERY_HIGH = 10
    HIGH = 30
    ABOVE_NORMAL = 40
    NORMAL = 50
    BELOW_NORMAL = 60
    LOW = 70
    VERY_LOW = 90
    LOWEST = 100


PriorityLike = Union[Priority, str, int]


def get_priority(priority: PriorityLike, key: str = "priority") -> int:
    """The integer value of an enum member, a level name in any case, or an int in 0..100."""
    if isinstance(priority, Priority):
        return int(priority)
    levels = ", ".join(p.name for p in Priority)
    if isinstance(priority, int) and not isinstance(priority, bool):  # True is no priority
        if 0 <= priority <= 100:
            return priority
        raise ConfigError(key, f"priority {priority} is out of range: use an int in 0..100 or a "
                               f"level name ({levels})")
    elif isinstance(priority, str):
        member = Priority.__members__.get(priority.strip().upper())
        if member is not None:
            return int(member)
        raise ConfigError(key, f"unknown priority {priority!r}"
                               f"{did_you_mean(priority.upper(), Priority.__members__)}; use one of "
                               f"{levels} or an int in 0..100")
    raise ConfigError(key, f"priority must be a Priority, a level name or an int in 0..100, got "
                           f"{type(priority).__name__} {priority!r}")


def priority_name(value: int) -> str:
    """``'NORMAL (50)'`` for a named level, ``'45'`` otherwise (for plans and tables)."""
    try:
        return f"{Priority(value).name} ({value})"
    except ValueError:
        return str(value)
