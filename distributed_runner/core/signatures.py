"""Keyword arguments checked against a callable's signature before it is called.

A config names a class and its arguments; a misspelled or missing argument should be one line
naming the config key (``model.widht: DigitsCNN has no argument 'widht' (did you mean
'width'?)``), not a ``TypeError`` from deep inside a constructor. The registries' ``build``
checks this way, and so does every module that calls a user-named callable itself (loops,
optimizers, schedulers, data loaders, hooks). Kept apart from :mod:`.registry` so that a module
that only checks arguments does not depend on the registries.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from distributed_runner.core.errors import ConfigError, did_you_mean


def _signature(fn: Callable) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: nothing to check
        return None


def _wrapper_takes_any_keyword(fn: Callable) -> bool:
    """Whether ``fn`` (or its ``__init__``) is a wrapper taking ``**kwargs`` around a narrower
    signature: Hugging Face's config classes declare their fields but take any keyword (an
    ``__init__(*args, **kwargs)`` wrapper stores the rest), so an extra keyword is theirs to
    judge."""
    try:
        raw = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in raw.parameters.values())


def accepts(fn: Callable, name: str) -> bool:
    """Whether ``fn`` takes a keyword argument called ``name`` (explicitly or via ``**kwargs``)."""
    sig = _signature(fn)
    if sig is None:
        return False
    params = sig.parameters
    if name in params and params[name].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.VAR_POSITIONAL,
    ):
        return True
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def check_arguments(
    fn: Callable, args: dict[str, Any], key: str, supplied: Iterable[str] = ()
) -> None:
    """Raise a one-line error for an unknown or a missing keyword argument of ``fn``.

    ``supplied`` names arguments the caller passes itself (positionally), e.g. an optimizer's
    params.
    """
    sig = _signature(fn)
    if sig is None:
        return
    params = dict(sig.parameters)
    params.pop("self", None)
    name = getattr(fn, "__name__", repr(fn))
    has_var_kw = any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()
    ) or _wrapper_takes_any_keyword(fn)
    named = [
        n
        for n, p in params.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]
    if not has_var_kw:
        for arg in args:
            if arg not in named:
                takes = ", ".join(named) or "nothing"
                raise ConfigError(
                    f"{key}.{arg}",
                    f"{name} has no argument {arg!r}{did_you_mean(arg, named)}; it takes: {takes}",
                )
    given = set(args) | set(supplied)
    for n, p in params.items():
        if (
            p.default is inspect.Parameter.empty
            and n not in given
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ):
            raise ConfigError(f"{key}.{n}", f"{name} needs argument {n!r}: add {n}=... to {key}")
