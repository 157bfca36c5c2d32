"""CheckpointHook's arguments, checked when the hook is built.

A mistake here (a float interval, ``save_topk=0``, a misspelled published key, a rule the
hook cannot infer) would otherwise show up late, as a missing or wrong checkpoint, so each is
refused at construction in one line naming the argument. Kept apart from the hook so its file
holds what the hook does during training.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from distributed_runner.checkpoint_parts import PUBLISHABLE_KEYS
from distributed_runner.errors import ArgumentError

# the keys published_keys may name: the checkpoint's parts (checkpoint_parts.PARTS) that a file
# of its own can hold
CHECKPOINT_KEYS = PUBLISHABLE_KEYS


def as_list(value: str | Sequence[str] | None) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def check_numbers(
    interval: int | str,
    max_keep_ckpts: int,
    save_begin: int,
    save_topk: int,
    by_epoch: bool,
    async_save: bool,
) -> None:
    """Refuse, one line naming the argument, what would otherwise misbehave silently later (a
    float interval, save_topk=0, by_epoch='no')."""
    if isinstance(interval, bool) or (
        isinstance(interval, (int, float))
        and (interval != int(interval) or interval == 0 or interval < -1)
    ):
        raise ArgumentError(
            "interval",
            f"got {interval!r}; takes an int >= 1, -1 (no "
            f"periodic checkpoints) or a spec like '500it', "
            f"'2ep', '30min'",
        )
    for name, value, low in (
        ("max_keep_ckpts", max_keep_ckpts, -1),
        ("save_begin", save_begin, 0),
        ("save_topk", save_topk, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ArgumentError(name, f"got {value!r}; takes an int >= {low}")
    for name, flag in (("by_epoch", by_epoch), ("async_save", async_save)):
        if not isinstance(flag, bool):
            raise ArgumentError(name, f"got {flag!r}; takes True or False")


def checked_published_keys(keys: str | Sequence[str] | None) -> list:
    """``published_keys`` checked against the checkpoint's parts (a typo would publish a file
    without them); the weights must be among them."""
    keys = as_list(keys)
    for k in keys:
        if k not in CHECKPOINT_KEYS:
            raise ArgumentError(
                "published_keys",
                f"unknown checkpoint key {k!r}; choose from {', '.join(CHECKPOINT_KEYS)}",
            )
    if keys and "state_dict" not in keys:
        raise ArgumentError("published_keys", "must include 'state_dict' (the weights)")
    return keys


def best_rules(save_best: list[str], rules: list, infer: Callable[[str], str]) -> list[str | None]:
    """One rule per ``save_best`` key: given once for all, one each, or inferred from the
    key's name by ``infer`` ('auto' waits for the first metric's)."""
    if "auto" in save_best and len(save_best) > 1:
        raise ArgumentError("save_best", "'auto' cannot be combined with other keys")
    if len(rules) == 1 and len(save_best) > 1:
        rules = rules * len(save_best)
    if rules and len(rules) != len(save_best):
        raise ArgumentError("rule", f"give one rule or one per save_best key ({len(save_best)})")
    for r in rules:
        if r not in ("greater", "less"):
            raise ArgumentError("rule", f"unknown rule {r!r}: use 'greater' or 'less'")
    rules = rules or [None] * len(save_best)
    return [
        infer(key) if key != "auto" and r is None else r
        for key, r in zip(save_best, rules, strict=True)
    ]
