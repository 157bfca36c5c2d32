"""TuneForkHook: a PBT trial that continues another trial's run applies its own values to it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.checkpoint.files import load_file
from distributed_runner.checkpoint.parts import hook_state
from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import Hook
from distributed_runner.tune.mutations import MUTABLE_KEYS
from hooks.non_finite_loss_hook import scale_learning_rate

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class TuneForkHook(Hook):
    """At ``before_train`` — after the run resumed from the donor trial's checkpoint, so the
    weights, optimizer moments, schedulers, RNG and sampler position are the donor's — apply this
    trial's own values of the mutated keys, ``changes={dotted key: [donor's value, own value]}``:

    * ``optim_wrapper.optimizer.lr``: every param group's ``lr`` and ``initial_lr`` and the
      schedulers' base values scaled by own/donor's (the schedule keeps its shape, ``lr_mult``
      ratios are kept) — Ray Tune alone would leave the donor's rates in force (ray#36660);
    * ``weight_decay`` / ``momentum``: each group's value scaled by own/donor's (set when the
      donor's was 0).

    The trial's identity is its own: CheckpointHook's file bookkeeping, restored from the
    donor's checkpoint, names the donor's files; it is replaced by the trial's own, read from
    ``own_checkpoint`` (the trial's newest checkpoint before the fork, if any), so that
    ``max_keep_ckpts`` and the best files go on counting the trial's own files; the MLflow run is
    the trial's own (its sink's ``run_id``, set by the trial's config). The fork is logged with
    the donor, the iteration and every change.

    Added by ``drun tune`` to the config of a PBT trial that exploits another; not meant for a
    config. Ranks: all apply the same change.
    """

    priority = "HIGH"  # before other hooks' before_train read the optimizer

    def __init__(
        self,
        donor: str,
        changes: dict[str, Any],
        iteration: int | None = None,
        own_checkpoint: str | None = None,
    ) -> None:
        for key, pair in changes.items():
            if key not in MUTABLE_KEYS:
                raise ArgumentError(
                    f"changes.{key}", f"no applier; mutable: {', '.join(MUTABLE_KEYS)}"
                )
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise ArgumentError(
                    f"changes.{key}", f"takes [donor's value, own value], got {pair!r}"
                )
        self.donor = donor
        self.changes = {k: (float(a), float(b)) for k, (a, b) in changes.items()}
        self.iteration = iteration
        self.own_checkpoint = own_checkpoint

    def before_train(self, runner: RunnerAPI) -> None:
        applied = []
        for key, (old, new) in self.changes.items():
            field = MUTABLE_KEYS[key]
            if field == "lr":
                scale_learning_rate(runner, new / old if old else 1.0)
            else:
                for group in runner.optim_wrapper.param_groups:
                    if field in group:
                        group[field] = group[field] * new / old if old else new
            applied.append(f"{key} {old:g} -> {new:g}")
        checkpoints = runner.get_hook("checkpoint")
        if checkpoints is not None and callable(getattr(checkpoints, "continue_bookkeeping", None)):
            checkpoints.continue_bookkeeping(self._own_saved_state())
        if runner.rank == 0:
            runner.logger.info(
                "PBT fork: continuing trial %s's run from iteration %d with %s",
                self.donor,
                runner.iter if self.iteration is None else self.iteration,
                "; ".join(applied) or "no change",
            )

    def _own_saved_state(self) -> dict:
        """What this trial's CheckpointHook (registered as ``checkpoint``) saved in the trial's own
        newest checkpoint ({} if none): the files it keeps and its bests."""
        if self.own_checkpoint and Path(self.own_checkpoint).is_file():
            return hook_state(load_file(self.own_checkpoint, "own_checkpoint"), "checkpoint")
        return {}
