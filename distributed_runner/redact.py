"""Secrets out of everything the run writes: config dumps, checkpoint meta, sinks.

A value is redacted when its key looks like a secret: it contains ``token``, ``password``,
``passwd``, ``secret`` or ``credential``, is ``key``, or ends in ``api_key``/``access_key``/
``private_key`` (with or without the underscore). ``label_key`` and friends are not secrets.
"""
from __future__ import annotations

import re
from typing import Any

REDACTED = "******"
_SECRET = re.compile(r"token|password|passwd|secret|credential|api_?key$|access_?key$|"
                     r"private_?key$|^key$", re.IGNORECASE)


def is_secret_key(key: Any) -> bool:
    return isinstance(key, str) and bool(_SECRET.search(key))


def redact(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples) with secret-looking keys' values replaced."""
    if isinstance(obj, dict):
        return type(obj)({k: (REDACTED if is_secret_key(k) and v is not None else redact(v))
                          for k, v in obj.items()})
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(redact(v) for v in obj)
    return obj


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """``{'a': {'b': 1}, 'c': [2]}`` -> ``{'a.b': 1, 'c.0': 2}`` (for params and hparams)."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(obj, (list, tuple)):
        if not obj:
            out[prefix[:-1]] = "[]"
        for i, v in enumerate(obj):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = obj
    return out
