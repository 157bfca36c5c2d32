"""The one counting rule periodic things share (hooks' helpers and :class:`~.interval.Interval`).

A leaf module, importable from ``hooks`` and from the engine alike without either importing the
other.
"""

from __future__ import annotations


def every_nth(done: int, n: int) -> bool:
    """``done`` (counted from the start, 1-based) is a multiple of ``n``; ``n <= 0``: never."""
    return n > 0 and done >= 0 and done % n == 0
