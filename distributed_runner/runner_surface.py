"""What hooks read and call on the Runner to reach its hooks, its position and its requests.

Kept apart from :mod:`.runner` so that file holds construction, the entry points and
checkpoints: :class:`RunnerSurface` is the part of the public surface (see the Runner's
docstring) that only forwards: to the model and the training loop (``model``,
``train_dataloader``), to the dispatcher (``_hooks``: the hook tables, their timings and the
loops' callers), to the training position (``_state``, the one :class:`TrainState`) and to the
control requests (``requests``). The Runner inherits it and sets those attributes.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

from torch import nn

from .errors import ConfigError

if TYPE_CHECKING:
    from .control import ControlRequests
    from .dispatch import HookDispatcher


class RunnerSurface:
    """The forwarding part of the Runner's public surface; see the module docstring."""

    _hooks: HookDispatcher
    _model: nn.Module
    requests: ControlRequests
    train_loop: Any
    val_loop: Any

    @property
    def model(self) -> nn.Module:
        """The unwrapped model (never the DDP wrapper)."""
        return self._model

    @property
    def train_dataloader(self) -> Any:
        """The loader training iterates; assigning one replaces it there (MMEngine's property)."""
        return self.train_loop.dataloader if self.train_loop is not None else None

    @train_dataloader.setter
    def train_dataloader(self, loader: Any) -> None:
        if self.train_loop is None:
            raise ConfigError(
                "train_dataloader",
                "this Runner does not train: it needs "
                "train_dataloader, train_cfg and optim_wrapper",
            )
        self.train_loop.dataloader = loader

    @property
    def hooks(self) -> list:
        return [e.hook for e in self._hooks.entries]

    # the position, read from the one TrainState (all zeros, by_epoch True, when nothing trains);
    # attrgetter properties: hooks read these several times per iteration, and a getter written
    # in Python would cost a call each time
    train_state = property(attrgetter("_state"), doc="Where training is (TrainState).")
    epoch = property(attrgetter("_state.epoch"))
    iter = property(attrgetter("_state.iter"))
    max_epochs = property(attrgetter("_state.max_epochs"))
    max_iters = property(attrgetter("_state.max_iters"))
    by_epoch = property(
        attrgetter("_state.by_epoch"),
        doc="Whether training is epoch-based (True also when nothing trains).",
    )

    @property
    def mount_callers(self) -> dict:
        """Mount point -> the function that calls it (``caller(**kwargs)``), kept current as
        hooks are disabled: what the loops call on their hot path."""
        return self._hooks.callers

    @property
    def call_hook(self):
        """``call_hook(mount, **kwargs)``: run mount point ``mount`` on every hook that implements
        it, in call order. (The dispatcher's bound method itself: the loops call it several times
        per iteration.)"""
        return self._hooks.call

    step_guards = property(
        attrgetter("_hooks.step_guards"),
        doc="The StepGuard hooks (hooks.extension_points), in call order.",
    )

    def hook_bracket(self, before: str, after: str):
        """Context manager: ``before`` now, ``after`` at exit — also when the body raises."""
        return self._hooks.bracket(before, after)

    def hook_plan(self) -> str:
        return self._hooks.plan_text()

    def stateful_hooks(self) -> dict[str, Any]:
        """Registered name -> hook, for the hooks whose state a checkpoint keeps."""
        return {
            e.name: e.hook
            for e in self._hooks.entries
            if callable(getattr(e.hook, "state_dict", None))
        }

    def val_metric_names(self) -> list[str] | None:
        """The keys validation will report, if its metrics declare them (else None): hooks that
        name a metric (``save_best``, ``monitor``) check it before training starts."""
        if self.val_loop is None or not hasattr(self.val_loop.evaluator, "metric_names"):
            return None
        return self.val_loop.evaluator.metric_names()

    def get_hook(self, name: str) -> Any:
        """The hook registered under ``name`` (e.g. ``'checkpoint'``), or None."""
        return self._hooks.hook_named(name)

    def hook_timings(self) -> list:
        """Cumulative time per (hook, mount point), slowest first (:class:`HookTiming` rows)."""
        return self._hooks.timings()

    def hook_seconds(self) -> dict[str, float]:
        """Cumulative time per registered hook name, over all its mount points."""
        return self._hooks.seconds_by_hook()

    # -- requests (hooks request, the loop acts; see distributed_runner.control) ---------------
    def request_stop(self, reason: str) -> None:
        """End training after the current iteration (or validation), on every rank."""
        self.requests.request("stop", reason)

    def request_checkpoint(self, reason: str) -> None:
        """Save a checkpoint after the current iteration, on every rank."""
        self.requests.request("checkpoint", reason)

    def request_val(self, reason: str) -> None:
        """Run validation after the current iteration, on every rank."""
        self.requests.request("val", reason)
