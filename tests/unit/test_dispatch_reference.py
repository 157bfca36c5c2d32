"""The generated callers (dispatch.compile_caller) against the plain reference loop
(HookDispatcher.call_reference): for several hook tables, the same call script run through a
dispatcher of each kind must call the same hooks in the same order with the same arguments, count
and time the same calls, and end the same way under every error policy."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from distributed_runner.engine.dispatch import _TIMED, TIME_FIRST, HookDispatcher
from distributed_runner.engine.hook import MOUNT_POINTS
from hooks import Hook


class Holder:
    """Stands in for the runner: the dispatcher only passes it to hooks."""


def recording_hook(tag: str, log: list, mounts: tuple[str, ...], imix: tuple[str, ...] = (),
                   fail: Callable[[str, int], bool] | None = None, on_error: str = "raise",
                   priority: Any = "NORMAL") -> Hook:
    """A hook implementing ``mounts`` (``imix``: without a runner argument, iMIX's way) that logs
    ``(tag, mount, runner seen, kwargs)`` and raises on the n-th call of a mount point when
    ``fail(mount, n)``."""
    count: dict[str, int] = {}

    def record(self: Hook, mount: str, runner: Any, kwargs: dict) -> None:
        n = count[mount] = count.get(mount, 0) + 1
        log.append((tag, mount, type(runner).__name__, tuple(sorted(kwargs.items()))))
        if fail is not None and fail(mount, n):
            raise RuntimeError(f"{tag} failed at call {n} of {mount}")

    def make(mount: str) -> Callable[..., None]:
        if mount in imix:
            def imix_style(self):
                record(self, mount, self.trainer, {})
            return imix_style

        def mounted(self, runner, **kwargs):
            record(self, mount, runner, kwargs)
        return mounted

    attrs = {m: make(m) for m in mounts + imix}
    attrs.update(priority=priority, on_error=on_error)
    return type(f"Hook_{tag}", (Hook,), attrs)()


class ForwardingHook(Hook):
    """Implements the epoch/iteration mount points through MMEngine's helper (``_after_iter``)."""

    def __init__(self, log: list) -> None:
        self.log = log

    def _after_iter(self, runner, batch_idx, data_batch=None, outputs=None, mode="train"):
        self.log.append(("fwd", mode, batch_idx, data_batch, outputs))


TRAIN = ("before_train", "before_train_iter", "after_train_iter", "after_val_epoch")
RAISE_AT = {("before_train_iter", 2), ("after_train_iter", 37)}

TABLES: dict[str, Callable[[list], list[tuple[Hook, str, dict]]]] = {
    "empty": lambda log: [],
    "implements nothing": lambda log: [(Hook(), f"silent{i}", {}) for i in range(5)],
    "ordered": lambda log: [
        (recording_hook("low", log, TRAIN, priority="LOW"), "low", {}),
        (recording_hook("a", log, TRAIN), "a", {}),
        (recording_hook("high", log, TRAIN[1:3], priority="HIGH"), "high", {}),
        (recording_hook("b", log, MOUNT_POINTS), "b", {"priority": 10}),
    ],
    "imix": lambda log: [
        (recording_hook("imix", log, ("before_train",), imix=("after_train_iter",)), "imix", {}),
        (recording_hook("mm", log, TRAIN), "mm", {}),
        (ForwardingHook(log), "fwd", {}),
    ],
    "failing": lambda log: [
        # on a timed call (the first TIME_FIRST) and an untimed one (the unrolled path)
        (recording_hook("raise", log, TRAIN, fail=lambda m, n: (m, n) in RAISE_AT), "raise", {}),
        (recording_hook("warn", log, TRAIN, fail=lambda m, n: n % 5 == 0, on_error="warn"),
         "warn", {}),
        (recording_hook("dis_early", log, TRAIN, fail=lambda m, n: n == 7), "dis_early",
         {"on_error": "disable"}),
        (recording_hook("dis_late", log, TRAIN, fail=lambda m, n: n == 45), "dis_late",
         {"on_error": "disable"}),  # at after_train_iter's 45th call, an untimed one
        (recording_hook("after", log, TRAIN), "after", {"priority": "LOW"}),
    ],
}

CALLS = [  # (mount point, keyword arguments); some left out: hooks get None for them
    ("before_train", {}),
    *[("before_train_iter", {"batch_idx": i, "data_batch": {"x": i}}) for i in range(30)],
    *[("after_train_iter", {"batch_idx": i, "outputs": {"loss": i}}) for i in range(60)],
    ("after_val_epoch", {"metrics": {"acc": 1.0}}),
    ("after_val_epoch", {}),
    ("before_test", {}),
]


def run_script(generated: bool, table: str) -> dict:
    """Register the table on a fresh dispatcher, run CALLS, and collect what can be compared."""
    log: list = []
    holder = Holder()
    d = HookDispatcher(holder, generated=generated)
    for hook, name, options in TABLES[table](log):
        d.register(hook, name, **options)
    d.check()
    outcomes = []
    for i, (mount, kwargs) in enumerate(CALLS):
        call = d.callers[mount] if i % 2 else (lambda m=mount, **kw: d.call(m, **kw))
        try:
            call(**kwargs)
            outcomes.append(None)
        except Exception as exc:  # noqa: BLE001 - compared below
            outcomes.append((type(exc).__name__, str(exc), tuple(getattr(exc, "__notes__", ()))))
    return {
        "log": log,
        "outcomes": outcomes,
        "mount_calls": dict(d._mount_calls),
        "slots": [(s.entry.name, s.mount, s.timed, s.call_base, s.call_end) for s in d._slots],
        "entries": [(e.name, e.disabled, dict(e.errors)) for e in d.entries],
        "timings": sorted((t.name, t.mount, t.calls, t.errors) for t in d.timings()),
        "plan": d.plan(),
        "plan_text": d.plan_text(),
    }


@pytest.mark.parametrize("table", sorted(TABLES))
def test_generated_callers_do_what_the_reference_loop_does(table):
    generated, reference = run_script(True, table), run_script(False, table)
    for key in generated:
        assert generated[key] == reference[key], key
    if table not in ("empty", "implements nothing"):
        assert generated["log"], "the script called no hook"
    assert generated["mount_calls"]["after_train_iter"] == 60  # counted also when empty


def test_the_script_reaches_every_policy_on_both_paths():
    out = run_script(True, "failing")
    assert _TIMED[2] and not _TIMED[37] and not _TIMED[45]  # both paths fail below
    raised = [o for o in out["outcomes"] if o is not None]
    assert len(raised) == 2 and all("hook 'raise'" in o[2][0] for o in raised)
    entries = {name: (disabled, errors) for name, disabled, errors in out["entries"]}
    assert entries["dis_early"][0] and entries["dis_late"][0] and not entries["warn"][0]
    assert sum(entries["warn"][1].values()) > 5
    # the hooks after a failed one were still called ('after' saw every call but before_test,
    # which it does not implement, and the two a 'raise' hook ended)
    assert sum(1 for tag, *_ in out["log"] if tag == "after") == len(CALLS) - 1 - 2
    # calls beyond TIME_FIRST took both paths: some timed, most not
    slot = next(s for s in out["slots"] if s[:2] == ("after", "after_train_iter"))
    assert TIME_FIRST <= slot[2] < 60


def test_unknown_arguments_are_refused_alike():
    d_gen, d_ref = (HookDispatcher(holder := Holder(), generated=g) for g in (True, False))
    del holder
    for d in (d_gen, d_ref):
        with pytest.raises(TypeError, match="unexpected keyword argument 'batch'"):
            d.call("before_train_iter", batch=1)
        assert d._mount_calls["before_train_iter"] == 0
