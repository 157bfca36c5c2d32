"""Whether a larger value of a metric is better, and whether a named metric is reported at all:
what save-best and early stopping share.

MMEngine's keys: a metric whose name contains one of :data:`GREATER_KEYS` is better when larger,
one containing :data:`LESS_KEYS` when smaller. An exact match wins over a substring match.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from distributed_runner.core.errors import ArgumentError

GREATER_KEYS = ["acc", "top", "AR@", "auc", "precision", "mAP", "mDice", "mIoU", "mAcc", "aAcc"]
LESS_KEYS = ["loss"]


def infer_rule(
    key: str, greater_keys: Sequence[str] = GREATER_KEYS, less_keys: Sequence[str] = LESS_KEYS
) -> str | None:
    """``'greater'``/``'less'`` for a metric key: an exact match first, then a substring match
    (``greater_keys`` first); None when neither list says."""
    low = key.lower()
    greater = [k.lower() for k in greater_keys]
    less = [k.lower() for k in less_keys]
    if low in greater:
        return "greater"
    if low in less:
        return "less"
    if any(k in low for k in greater):
        return "greater"
    if any(k in low for k in less):
        return "less"
    return None


def require_metric(arg: str, key: str, reported: Iterable[str] | None) -> None:
    """An ArgumentError on ``arg`` (``save_best``, ``monitor``) when ``key`` is not among the
    metric names ``reported``; None means the names are not known yet, so nothing is checked."""
    if reported is None:
        return
    names = list(reported)
    if key not in names:
        raise ArgumentError(
            arg, f"{key!r} is not a validation metric; the evaluator reports: {', '.join(names)}"
        )
