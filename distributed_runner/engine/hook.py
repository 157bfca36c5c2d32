"""The hook base class: 22 mount points, MMEngine's names and keyword signatures.

A hook written for MMEngine runs here after changing its imports::

    from hooks import Hook, HOOKS          # was: from mmengine.hooks import Hook
                                           #      from mmengine.registry import HOOKS

The mount points, in the order a training run reaches them (the loop's full pseudocode is in
:mod:`distributed_runner.engine.loops`):

==========================  =====================================================================
before_run / after_run      around a whole ``Runner.train()``, ``val()`` or ``test()`` call;
                            ``after_run`` also runs when training raises, so sinks can flush
after_load_checkpoint       after ``resume`` / ``load_from`` *read* a checkpoint dict, before
                            anything is restored from it: hooks may rewrite it
before_train / after_train  around the training loop (``after_train`` also on failure)
before/after_train_epoch    around one pass over the training data (periodic saving is here)
before/after_train_iter     around one optimizer step; ``outputs`` holds the detached losses
before/after_val(_epoch)    around a validation pass; ``after_val_epoch`` receives the metrics
before/after_val_iter       around one validation batch; ``outputs`` holds the predictions
before/after_test(...)      the same four for testing
before_save_checkpoint      just before a checkpoint dict is written; may add keys to it
after_save_checkpoint       (ours, not MMEngine's) after it was written: ``(path, checkpoint)``
after_replica_change        (ours) a fault-tolerant run's quorum lost or regained replicas:
                            ``(event)``, a :class:`~distributed_runner.fault_tolerance.events.
                            ReplicaEvent` (kind, slots, iteration, seconds, replicas)
==========================  =====================================================================

As in MMEngine, the base class forwards the train/val/test epoch and iteration mount points to
``_before_epoch``/``_after_epoch``/``_before_iter``/``_after_iter(..., mode=)``, so a hook may
override those instead. A hook written iMIX's way (``def after_train_iter(self)``, no runner
argument) is called without arguments and finds the runner as ``self.trainer``.

Besides the mount points, a hook may plug into the loop through the declared extension points in
:mod:`distributed_runner.engine.extension_points` (step guards, requested checkpoints, log sinks;
called outside the dispatcher, so not timed and not under ``on_error``); ``drun hooks`` shows every
mount point and extension point in use. The ``runner`` every mount point receives is typed
:class:`~distributed_runner.core.runner_api.RunnerAPI`: the part of the Runner a hook may rely on.

Counters follow MMEngine: inside a hook ``runner.epoch`` and ``runner.iter`` are 0-based and count
the epoch / iteration in progress; they advance *after* ``after_train_epoch`` /
``after_train_iter``.
So the helpers below count from 1: ``every_n_train_iters(runner, 5)`` is true after the 5th,
10th, ... iteration.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.core.errors import ConfigError, did_you_mean
from distributed_runner.core.interval import every_nth

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


DataBatch = dict | tuple | list | None

MMENGINE_MOUNT_POINTS: tuple[str, ...] = (
    "before_run",
    "after_run",
    "before_train",
    "after_train",
    "before_train_epoch",
    "after_train_epoch",
    "before_train_iter",
    "after_train_iter",
    "before_val",
    "after_val",
    "before_val_epoch",
    "after_val_epoch",
    "before_val_iter",
    "after_val_iter",
    "before_test",
    "after_test",
    "before_test_epoch",
    "after_test_epoch",
    "before_test_iter",
    "after_test_iter",
    "before_save_checkpoint",
    "after_load_checkpoint",
)
# Our additions to MMEngine's 22: a hook written for MMEngine never defines them, so it is
# unaffected; a hook written for us may.
ADDED_MOUNT_POINTS: tuple[str, ...] = ("after_save_checkpoint", "after_replica_change")
MOUNT_POINTS: tuple[str, ...] = MMENGINE_MOUNT_POINTS + ADDED_MOUNT_POINTS


class Hook:
    """Base class of every hook. Override any mount point; the rest cost nothing at dispatch.

    ``priority`` may be set as a class attribute (a :class:`~hooks.Priority`, its name, or an int);
    a ``priority=`` key in the hook's config wins over it. ``on_error`` (``'raise'``, ``'warn'``,
    ``'disable'``) is what the dispatcher does when a mount point of this hook raises; the config
    key of the same name wins. A hook that must survive resume defines ``state_dict()`` /
    ``load_state_dict(state)`` returning/accepting plain containers and tensors.
    """

    priority: Any = "NORMAL"
    on_error: str = "raise"

    # -- whole runs ---------------------------------------------------------------------------
    def before_run(self, runner: RunnerAPI) -> None:
        """Once per ``Runner.train()/val()/test()`` call, before any checkpoint is loaded."""

    def after_run(self, runner: RunnerAPI) -> None:
        """Once per ``train()/val()/test()`` call, also when it raised."""

    def after_load_checkpoint(self, runner: RunnerAPI, checkpoint: dict) -> None:
        """After ``resume`` or ``load_from`` read ``checkpoint`` and *before* anything is restored
        from it (MMEngine's order), so a hook may rewrite it (rename keys of an old checkpoint);
        ``runner.loading_for`` says for what: ``'resume'`` (the whole training state, also a
        rollback) or ``'load_from'`` (weights only)."""

    def before_save_checkpoint(self, runner: RunnerAPI, checkpoint: dict) -> None:
        """Just before ``checkpoint`` is written; add or adjust keys here."""

    def after_save_checkpoint(self, runner: RunnerAPI, path: Path, checkpoint: dict) -> None:
        """After ``checkpoint`` was written to ``path`` (by rank 0), on every rank, as often on
        each; an addition to MMEngine's mount points. Report, upload or index it here (under Ray,
        RayReportHook reports it to Ray Train here)."""

    def after_replica_change(self, runner: RunnerAPI, event: Any) -> None:
        """A fault-tolerant run's quorum changed (``event``: a
        :class:`~distributed_runner.fault_tolerance.events.ReplicaEvent`): a replica was lost
        (its step was trained again without it) or joined (healed from a peer); an addition to
        MMEngine's mount points, called on every replica of the quorum after the step."""

    # -- training ------------------------------------------------------------------------------
    def before_train(self, runner: RunnerAPI) -> None:
        """Before the first training epoch (after resume)."""

    def after_train(self, runner: RunnerAPI) -> None:
        """After the last training epoch, also when training raised."""

    def before_train_epoch(self, runner: RunnerAPI) -> None:
        """Before each training epoch (also before the rest of an epoch resumed in its middle)."""
        self._before_epoch(runner, mode="train")

    def after_train_epoch(self, runner: RunnerAPI) -> None:
        """After each training epoch, before ``runner.epoch`` advances."""
        self._after_epoch(runner, mode="train")

    def before_train_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: DataBatch = None
    ) -> None:
        """Before each training step. ``batch_idx`` counts within the epoch in an epoch-based
        loop; in an iteration-based loop it is the global iteration (``runner.iter``), as in
        MMEngine."""
        self._before_iter(runner, batch_idx=batch_idx, data_batch=data_batch, mode="train")

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
    ) -> None:
        """After each training step; ``outputs`` holds the detached losses (``outputs['loss']``)."""
        self._after_iter(
            runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs, mode="train"
        )

    # -- validation ----------------------------------------------------------------------------
    def before_val(self, runner: RunnerAPI) -> None:
        """Before a validation run."""

    def after_val(self, runner: RunnerAPI) -> None:
        """After a validation run."""

    def before_val_epoch(self, runner: RunnerAPI) -> None:
        """Before the pass over the validation data."""
        self._before_epoch(runner, mode="val")

    def after_val_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        """After validation; ``metrics`` are identical on every rank."""
        self._after_epoch(runner, mode="val")

    def before_val_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: DataBatch = None
    ) -> None:
        """Before each validation batch."""
        self._before_iter(runner, batch_idx=batch_idx, data_batch=data_batch, mode="val")

    def after_val_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: Sequence | None = None,
    ) -> None:
        """After each validation batch; ``outputs`` are the model's predictions."""
        self._after_iter(
            runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs, mode="val"
        )

    # -- testing -------------------------------------------------------------------------------
    def before_test(self, runner: RunnerAPI) -> None:
        """Before a test run."""

    def after_test(self, runner: RunnerAPI) -> None:
        """After a test run."""

    def before_test_epoch(self, runner: RunnerAPI) -> None:
        """Before the pass over the test data."""
        self._before_epoch(runner, mode="test")

    def after_test_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        """After testing; ``metrics`` are identical on every rank."""
        self._after_epoch(runner, mode="test")

    def before_test_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: DataBatch = None
    ) -> None:
        """Before each test batch."""
        self._before_iter(runner, batch_idx=batch_idx, data_batch=data_batch, mode="test")

    def after_test_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: Sequence | None = None,
    ) -> None:
        """After each test batch; ``outputs`` are the model's predictions."""
        self._after_iter(
            runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs, mode="test"
        )

    # -- MMEngine's shared helpers: the train/val/test epoch and iteration mount points above
    # forward to these, so a hook that overrides only ``_after_iter`` runs after every training,
    # validation and test iteration (``mode`` says which), as under MMEngine
    def _before_epoch(self, runner: RunnerAPI, mode: str = "train") -> None:
        """Before every train/val/test epoch, unless that mount point is overridden."""

    def _after_epoch(self, runner: RunnerAPI, mode: str = "train") -> None:
        """After every train/val/test epoch, unless that mount point is overridden."""

    def _before_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: DataBatch = None, mode: str = "train"
    ) -> None:
        """Before every train/val/test iteration, unless that mount point is overridden."""

    def _after_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: Any = None,
        mode: str = "train",
    ) -> None:
        """After every train/val/test iteration, unless that mount point is overridden."""

    # -- helpers (count from 1, as MMEngine does; n <= 0 means never) ---------------------------
    def every_n_epochs(self, runner: RunnerAPI, n: int, start: int = 0) -> bool:
        """True at the end of every n-th epoch counted from ``start``."""
        return every_nth(runner.epoch + 1 - start, n)

    def every_n_inner_iters(self, batch_idx: int, n: int) -> bool:
        """True on every n-th batch of the current epoch."""
        return n > 0 and (batch_idx + 1) % n == 0

    def every_n_train_iters(self, runner: RunnerAPI, n: int, start: int = 0) -> bool:
        """True after every n-th training iteration counted from ``start``."""
        return every_nth(runner.iter + 1 - start, n)

    def end_of_epoch(self, dataloader, batch_idx: int) -> bool:
        """True on the last batch of ``dataloader``."""
        return batch_idx + 1 == len(dataloader)

    def is_last_train_epoch(self, runner: RunnerAPI) -> bool:
        """True during the final training epoch."""
        return runner.epoch + 1 == runner.max_epochs

    def is_last_train_iter(self, runner: RunnerAPI) -> bool:
        """True during the final training iteration."""
        return runner.iter + 1 == runner.max_iters

    def get_triggered_stages(self) -> list[str]:
        """The mount points this hook overrides (MMEngine's name for it)."""
        return [name for name in MOUNT_POINTS if overrides(self, name)]


FORWARDED_TO: dict[str, str] = {
    f"{when}_{stage}_{unit}": f"_{when}_{unit}"
    for when in ("before", "after")
    for stage in ("train", "val", "test")
    for unit in ("epoch", "iter")
}
"""Mount point -> the MMEngine helper the base class forwards it to (``_after_iter`` ...)."""


def overrides(hook: Hook, name: str) -> bool:
    """Whether ``hook`` implements mount point ``name``: overrides it, or leaves it to the base
    class, which forwards it to a helper the hook overrides (``_after_iter`` ...). A hook that
    implements neither costs nothing there."""
    cls = type(hook)
    impl = getattr(cls, name, None)
    if impl is None:
        return False
    if impl is not getattr(Hook, name):
        return True
    helper = FORWARDED_TO.get(name)
    return helper is not None and getattr(cls, helper) is not getattr(Hook, helper)


def imix_style_mounts(hook: Hook) -> frozenset[str]:
    """The mount points ``hook`` implements the iMIX way (seed 004): ``def after_train_iter(self)``
    with no runner argument, reading ``self.trainer`` instead. The dispatcher calls those without
    arguments and sets ``hook.trainer`` (a weak proxy of the runner) when it registers the hook."""
    found = set()
    for name in MOUNT_POINTS:
        if not overrides(hook, name):  # (a forwarding base method takes the runner: not iMIX)
            continue
        try:
            params = list(inspect.signature(getattr(type(hook), name)).parameters.values())
        except (TypeError, ValueError):  # a builtin or an odd callable: called the usual way
            continue
        if len(params) == 1 and params[0].kind in (
            params[0].POSITIONAL_ONLY,
            params[0].POSITIONAL_OR_KEYWORD,
        ):
            found.add(name)
    return frozenset(found)


_LOOKS_LIKE_MOUNT_POINT = re.compile(r"^(before|after)_")


def check_mount_point_names(hook: Hook, key: str) -> None:
    """Reject a method whose name looks like a mount point but is not one (``key``: the hook's
    config key, for the error). ``after_train_iteration`` would otherwise be silently never
    called — the classic hook bug. The dispatcher checks every hook it registers."""
    for cls in type(hook).__mro__:
        if cls is Hook or cls is object:
            continue
        for attr, value in vars(cls).items():
            if callable(value) and _LOOKS_LIKE_MOUNT_POINT.match(attr) and attr not in MOUNT_POINTS:
                raise ConfigError(
                    key,
                    f"{type(hook).__name__}.{attr} is not a mount point"
                    f"{did_you_mean(attr, MOUNT_POINTS)}; rename it, or "
                    f"prefix it with '_' if it is a helper",
                )
