"""Hook priorities: lower runs first, equal values keep registration order."""

from __future__ import annotations

from enum import IntEnum

from distributed_runner.core.errors import ConfigError, did_you_mean


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


PriorityLike = Priority | str | int


def get_priority(priority: PriorityLike, key: str = "priority") -> int:
    """The integer value of an enum member, a level name in any case, or an int in 0..100."""
    if isinstance(priority, Priority):
        return int(priority)
    levels = ", ".join(p.name for p in Priority)
    if isinstance(priority, int) and not isinstance(priority, bool):  # True is no priority
        if 0 <= priority <= 100:
            return priority
        raise ConfigError(
            key,
            f"priority {priority} is out of range: use an int in 0..100 or a level name ({levels})",
        )
    elif isinstance(priority, str):
        member = Priority.__members__.get(priority.strip().upper())
        if member is not None:
            return int(member)
        near = did_you_mean(priority.upper(), Priority.__members__)
        raise ConfigError(
            key, f"unknown priority {priority!r}{near}; use one of {levels} or an int in 0..100"
        )
    raise ConfigError(
        key,
        f"priority must be a Priority, a level name or an int in 0..100, got "
        f"{type(priority).__name__} {priority!r}",
    )


# iMIX's seven levels (seed 004: lower runs first, its NORMAL is 30) and where each lands on
# MMEngine's scale; an int between two of them lands proportionally between their values
IMIX_LEVELS = {
    "HIGHEST": 0,
    "HIGHER": 10,
    "HIGH": 20,
    "NORMAL": 30,
    "LOW": 40,
    "LOWER": 50,
    "LOWEST": 60,
}
_IMIX_TO_OURS = {0: 0, 10: 10, 20: 30, 30: 50, 40: 70, 50: 90, 60: 100}


def imix_level(level: str | int, key: str = "level") -> int:
    """Our priority for an iMIX hook config's ``level``: one of its level names, an int in 0..60
    on its scale, or its ``PriorityStatus`` enum member (``level='HIGHER'`` -> 10,
    ``level=30`` -> NORMAL's 50)."""
    if hasattr(level, "value") and not isinstance(level, (str, int)):
        level = level.value
    if isinstance(level, str):
        name = level.strip().upper()
        if name not in IMIX_LEVELS:
            raise ConfigError(
                key,
                f"unknown iMIX level {level!r}"
                f"{did_you_mean(name, IMIX_LEVELS)}; use one of "
                f"{', '.join(IMIX_LEVELS)} or an int in 0..60 (or priority= "
                f"on MMEngine's scale)",
            )
        return _IMIX_TO_OURS[IMIX_LEVELS[name]]
    if isinstance(level, int) and not isinstance(level, bool) and 0 <= level <= 60:
        low = level // 10 * 10
        if low == level:
            return _IMIX_TO_OURS[level]
        a, b = _IMIX_TO_OURS[low], _IMIX_TO_OURS[low + 10]
        return round(a + (b - a) * (level - low) / 10)
    raise ConfigError(key, f"iMIX level must be a level name or an int in 0..60, got {level!r}")


def priority_name(value: int) -> str:
    """``'NORMAL (50)'`` for a named level, ``'45'`` otherwise (for plans and tables)."""
    try:
        return f"{Priority(value).name} ({value})"
    except ValueError:
        return str(value)
