"""Checks of one config value each, shared by every part that checks its own config section.

Each raises one :class:`~distributed_runner.core.errors.ConfigError` naming the key path, what it
got and what it takes; each returns quietly when the key is absent (its default applies).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from distributed_runner.core.errors import ConfigError

_MISSING = object()


def show_value(value: Any) -> str:
    """A value as an error shows it: its repr, cut so the message stays one short line."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive_int(
    cfg: dict, name: str, key: str, minimum: int = 1, allowed: Iterable[Any] = ()
) -> None:
    """``cfg[name]``, if present, is an int >= ``minimum`` (or one of ``allowed``)."""
    value = cfg.get(name, _MISSING)
    if value is _MISSING or value in tuple(allowed):
        return
    if not is_int(value) or value < minimum:
        also = "".join(f" or {a!r}" for a in allowed)
        raise ConfigError(
            f"{key}.{name}", f"got {show_value(value)}; takes an int >= {minimum}{also}"
        )


def boolean(cfg: dict, name: str, key: str) -> None:
    value = cfg.get(name, _MISSING)
    if value is not _MISSING and not isinstance(value, bool):
        raise ConfigError(f"{key}.{name}", f"got {show_value(value)}; takes True or False")


def number(cfg: dict, name: str, key: str, minimum: float = 0.0, exclusive: bool = False) -> None:
    """A finite int or float >= ``minimum`` (> with ``exclusive``)."""
    value = cfg.get(name, _MISSING)
    if value is _MISSING:
        return
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > minimum if exclusive else value >= minimum)
    )
    if not ok:
        bound = f"> {minimum:g}" if exclusive else f">= {minimum:g}"
        raise ConfigError(
            f"{key}.{name}", f"got {show_value(value)}; takes a finite number {bound}"
        )


def mapping(cfg: dict, name: str, optional: bool = True) -> dict | None:
    value = cfg.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise ConfigError(name, f"got {show_value(value)}; takes a dict")
    return value


def all_or_none(what: str, parts: dict, hint: str = "") -> bool:
    """Whether all of ``parts`` are given (False: none is); one line naming the first missing
    one when only some are."""
    missing = [k for k, v in parts.items() if v is None]
    if missing and len(missing) < len(parts):
        *first, last = parts
        raise ConfigError(
            missing[0],
            f"{what} needs {', '.join(first)} and {last} together; add {missing[0]}{hint}",
        )
    return not missing
