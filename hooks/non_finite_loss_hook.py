"""NonFiniteLossHook: what to do when the loss is NaN or infinite — raise, skip, or roll back."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.extension_points import StepGuard
from distributed_runner.engine.hook import Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


POLICIES = ("raise", "skip", "rollback")


@HOOKS.register_module()
class NonFiniteLossHook(Hook, StepGuard):
    """A step guard checked between the forward pass and backward on every iteration.

    The ranks agree first (one all-reduce MIN per iteration when distributed): if the loss is
    non-finite on *any* rank, every rank takes the same action —

    * ``policy='raise'``: ``FloatingPointError`` naming the iteration;
    * ``policy='skip'``: no backward and no optimizer step (gradients of an unfinished
      accumulation window are dropped too); the iteration still counts; ``skipped_steps`` is
      logged;
    * ``policy='rollback'``: every rank restores the newest checkpoint (rank 0 reads it and
      sends it) and multiplies the learning rate by ``lr_scale`` (optimizer and schedulers'
      base values), then training continues from there.

    After ``max_events`` events the next one raises. ``events`` and the cumulative LR factor are
    in the checkpoint (and survive the rollback itself). Checking costs one host-device sync per
    iteration on GPU. Ranks: all.
    """

    priority = "NORMAL"

    def __init__(self, policy: str = "raise", lr_scale: float = 0.5, max_events: int = 3) -> None:
        if policy not in POLICIES:
            raise ArgumentError(
                "policy", f"unknown policy {policy!r}: use {', '.join(map(repr, POLICIES))}"
            )
        if not 0.0 < float(lr_scale) <= 1.0:
            raise ArgumentError("lr_scale", "must be in (0, 1]")
        if int(max_events) < 0:
            raise ArgumentError("max_events", "must be >= 0")
        self.policy, self.lr_scale, self.max_events = policy, float(lr_scale), int(max_events)
        self.events = 0
        self.lr_factor = 1.0
        self._kept: dict | None = None

    # -- the StepGuard extension point (engine.extension_points; called by the training loop) ---
    def check_loss(self, loss: torch.Tensor) -> bool:
        return bool(torch.isfinite(loss).all())

    def reject_step(self, runner: RunnerAPI, loss: torch.Tensor) -> str:
        self.events += 1
        where = (
            f"non-finite loss at iteration {runner.iter + 1} (rank {runner.rank}: {loss.item()})"
        )
        if self.policy == "raise" or self.events > self.max_events:
            limit = "" if self.policy == "raise" else f" after {self.max_events} events"
            raise FloatingPointError(f"{where}{limit}; lower the learning rate or clip gradients")
        runner.message_hub.update_info("non_finite_events", self.events)
        runner.logger.warning(
            "%s: %s (event %d of at most %d)",
            where,
            "step skipped on every rank"
            if self.policy == "skip"
            else f"rolling back and scaling the LR by {self.lr_scale}",
            self.events,
            self.max_events,
        )
        if self.policy == "rollback":
            self._kept = self.state_dict()
        return self.policy

    def on_rollback(self, runner: RunnerAPI) -> None:
        """The checkpoint restored older hook state: keep ours, then scale the LR."""
        if self._kept is not None:
            self.load_state_dict(self._kept)
            self._kept = None
        self.lr_factor *= self.lr_scale
        scale_learning_rate(runner, self.lr_scale)
        runner.logger.warning(
            "learning rate scaled by %s (now %s of the configured schedule)",
            self.lr_scale,
            self.lr_factor,
        )

    def state_dict(self) -> dict:
        return {"events": self.events, "lr_factor": self.lr_factor}

    def load_state_dict(self, state: dict) -> None:
        self.events = int(state.get("events", 0))
        self.lr_factor = float(state.get("lr_factor", 1.0))


def scale_learning_rate(runner: RunnerAPI, factor: float) -> None:
    """Multiply the current LR and the schedulers' base values (so schedules stay scaled)."""
    for group in runner.optim_wrapper.param_groups:
        group["lr"] *= factor
        if "initial_lr" in group:
            group["initial_lr"] *= factor
    for sched in runner.param_schedulers:
        inner = getattr(sched, "scheduler", sched)
        if hasattr(inner, "base_lrs"):
            inner.base_lrs = [lr * factor for lr in inner.base_lrs]
