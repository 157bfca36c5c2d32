"""Secrets out of everything the run writes: config dumps, checkpoint meta, sinks.

A value is redacted when its key looks like a secret: it contains ``token``, ``password``,
``passwd``, ``secret`` or ``credential``, is ``key``, or ends in ``api_key``/``access_key``/
``private_key`` (with or without the underscore). ``label_key`` and friends are not secrets,
nor are token ids and counts (``bos_token_id``, ``tokens_key``, ``max_tokens``).

Credentials inside URLs are redacted wherever a string holds one, whatever its key
(:func:`redact_url`): the password of ``http://user:PASSWORD@host:5000`` and the values of
secret-looking query parameters (``?token=...``). Anything that prints or stores a tracking URI
goes through it.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "******"
_SECRET = re.compile(
    r"token|password|passwd|secret|credential|api_?key$|access_?key$|"
    r"private_?key$|^key$",
    re.IGNORECASE,
)


# scheme://user:password@  and  ?|&secret_name=value
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*:)([^/\s@]+)(@)")
_URL_QUERY = re.compile(r"([?&])([^=&#\s]+)=([^&#\s]*)")


# keys that speak of tokens but hold no secret: token ids and counts (a model config's
# ``bos_token_id``, IterTimerHook's ``tokens_key``, ``max_tokens``, ``tokens_per_s``)
_TOKEN_COUNT = re.compile(r"tokens?_(ids?|key|per_s)$|^(n|num|max|min)_tokens?$", re.IGNORECASE)


def is_secret_key(key: Any) -> bool:
    return isinstance(key, str) and bool(_SECRET.search(key)) and not _TOKEN_COUNT.search(key)


def redact_url(text: str) -> str:
    """``text`` with URL passwords and secret-looking query values replaced by ``******``."""
    if "://" not in text:
        return text
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    return _URL_QUERY.sub(
        lambda m: (
            f"{m.group(1)}{m.group(2)}={REDACTED if is_secret_key(m.group(2)) else m.group(3)}"
        ),
        text,
    )


# free text: ``key=value``, ``key: value``, ``'key': 'value'``, ``"key": "value"`` (a dict's repr,
# JSON, an environment listing, a command line) — the key is checked with is_secret_key, so
# ``tokens_per_s: 1200`` stays; a bare ``key`` is left alone in prose ("unknown key: 'lr'")
_PAIR = re.compile(
    r"""(?P<key>[A-Za-z_][\w.-]*)(?P<sep>['"]?\s*[:=]\s*['"]?)(?P<value>[^\s'",;&)}\]]+)"""
)
_SECRET_WORDS = ("token", "passw", "secret", "credential", "key")  # what _SECRET looks for
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")


def _may_hold_secret_pair(text: str) -> bool:
    """Whether a word of ``text`` is a secret-looking key (:func:`is_secret_key`), found with
    ``str.find`` rather than a regular expression: this runs on every line the process writes,
    training lines among them (``tokens_per_s: 11000`` is found and let go in a few µs; the
    regular expressions cost 10-20 µs a line)."""
    low = text.lower()
    for word in _SECRET_WORDS:
        start = low.find(word)
        while start != -1:
            begin, end = start, start + len(word)
            while begin and low[begin - 1] in _KEY_CHARS:
                begin -= 1
            while end < len(low) and low[end] in _KEY_CHARS:
                end += 1
            if low[begin:end] != "key" and is_secret_key(text[begin:end]):
                return True
            start = low.find(word, end)
    return False


def _masked_pair(match: re.Match) -> str:
    key = match.group("key")
    if key.lower() == "key" or not is_secret_key(key) or match.group("value") == REDACTED:
        return match.group(0)
    return f"{key}{match.group('sep')}{REDACTED}"


# ``user:password@host`` without a scheme (a Ray address, a hint quoting one)
_BARE_USERINFO = re.compile(r"(?<![\w/:@])([A-Za-z0-9._~+-]+:)([^\s/@:]+)(@[A-Za-z0-9][\w.-]*)")


def redact_text(text: str) -> str:
    """``text`` as it may leave the process — a log line, an exception's message, a report:
    credentials in URLs (:func:`redact_url`) and the values of secret-looking keys written as
    ``key=value`` or ``key: value`` (quoted or not) masked, and the password of a bare
    ``user:password@host``, whoever wrote the text."""
    if "://" in text:
        text = redact_url(text)
    if "@" in text:
        text = _BARE_USERINFO.sub(lambda m: m.group(1) + REDACTED + m.group(3), text)
    if not _may_hold_secret_pair(text):
        return text
    return _PAIR.sub(_masked_pair, text)


def redact(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, tuples) with secret-looking keys' values replaced, and
    credentials in URL strings (:func:`redact_url`)."""
    if isinstance(obj, dict):
        return type(obj)(
            {
                k: (REDACTED if is_secret_key(k) and v is not None else redact(v))
                for k, v in obj.items()
            }
        )
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(redact(v) for v in obj)
    if isinstance(obj, str):
        return redact_url(obj)
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
