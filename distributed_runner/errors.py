"""User-facing errors.

A user mistake (bad config key, unknown ``type``, unreadable file, a checkpoint that is not one) is
reported as one line that names where the problem is and what to do about it. The CLI prints these
without a traceback; everything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import difflib
from typing import Iterable


class ConfigError(ValueError):
    """A mistake in the user's input, reported as one actionable line.

    ``key`` is the dotted config path (or file name) the problem lives at; it prefixes the message so
    the user knows where to look.
    """

    def __init__(self, key: str | None, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)


def closest(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """Candidates that look like ``word`` (case-insensitive), best first."""
    pool = list(candidates)
    lowered = {c.lower(): c for c in pool}
    hits = difflib.get_close_matches(word.lower(), list(lowered), n=n, cutoff=0.5)
    return [lowered[h] for h in hits]


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` or the empty string."""
    hits = closest(word, candidates)
    if not hits:
        return ""
    return " (did you mean " + " or ".join(repr(h) for h in hits) + "?)"
