"""User-facing errors.

A user mistake (bad config key, unknown ``type``, unreadable file, a checkpoint that is not one) is
reported as one line that names where the problem is and what to do about it. The CLI prints these
without a traceback; everything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable, Iterator


class ConfigError(ValueError):
    """A mistake in the user's input, reported as one actionable line.

    ``key`` is the dotted config path (or file name) the problem lives at; it prefixes the message
    so the user knows where to look.
    """

    def __init__(self, key: str | None, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}" if key else message)

    def __reduce__(self) -> tuple:
        # rebuilt from (key, message), not from the formatted text: a ConfigError raised in a Ray
        # worker crosses to the driver pickled, and unpickling called __init__ with one argument
        return type(self), self._init_args(), self.__dict__

    def _init_args(self) -> tuple:
        return self.key, self.message


class ArgumentError(ConfigError):
    """A bad constructor argument, keyed relative to the object being built (``'save_topk'``,
    ``'tta_cfg.type'``; ``''`` for the object as a whole).

    Whoever knows where the object sits in the config puts the real path in front:
    :meth:`Registry.build <distributed_runner.core.registry.Registry.build>` for errors raised while
    building, the hook dispatcher for errors a hook raises later. So a CheckpointHook in
    ``custom_hooks[0]`` reports ``custom_hooks[0].save_topk``, never a path typed into the hook.
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(argument.lstrip(".") or None, message)

    def _init_args(self) -> tuple:
        return self.key or "", self.message

    def under(self, key: str) -> ConfigError:
        """The same error, placed at config path ``key``."""
        full = f"{key}.{self.key}" if self.key and key else (key or self.key)
        error = ConfigError(full, self.message)
        error.__cause__ = self.__cause__
        return error


@contextlib.contextmanager
def argument_errors() -> Iterator[None]:
    """Inside a constructor: config errors raised with keys relative to its arguments (by
    ``Registry.resolve(spec, 'tta_cfg')``, say) become :class:`ArgumentError`."""
    try:
        yield
    except ArgumentError:
        raise
    except ConfigError as e:
        raise ArgumentError(e.key or "", e.message) from e.__cause__


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


def check_known_keys(block: Iterable[str], known: Iterable[str], section: str) -> None:
    """Each key of the config dict ``section`` is one of ``known``; else one line naming the key,
    the nearest known one and all of them (a misspelled key must not be ignored quietly)."""
    names = list(known)
    for key in block:
        if key not in names:
            raise ConfigError(
                f"{section}.{key}",
                f"unknown key{did_you_mean(key, names)}; {section} takes {', '.join(names)}",
            )


class DataReadError(RuntimeError):
    """Training data that stayed unreadable after retries (storage lost a file, a network
    outage): one line naming it; the run's checkpoints are intact (``drun`` exits 1, as for
    :class:`CheckpointWriteError`; on Ray the group restarts from the last one when
    ``max_failures`` allows)."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (the disk is full, ...); the ones written before it are
    intact. Not a config mistake (``drun`` exits 1), and never something to ignore: a hook's
    ``on_error='warn'`` would train on without ever saving."""
