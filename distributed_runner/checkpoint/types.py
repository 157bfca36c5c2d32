"""The types a checkpoint's parts are declared and handled with (:mod:`.parts`
holds the table of parts and their functions).

:class:`CheckpointSubject` is what a checkpoint is taken of and restored into, read from the
Runner in one place; :class:`SaveOptions` and :class:`LoadContext` carry a save's choices and a
load's circumstances; :class:`Part` declares one key of a checkpoint; :data:`ABSENT` is what a
collect function returns to leave its part out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


class _Absent:
    """What a collect function returns to leave its part out of this checkpoint (None will not
    do: the scaler's state is None without AMP, and the key is kept)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


@dataclass
class CheckpointSubject:
    """What a checkpoint is taken of and restored into (built anew for every save and load,
    so a hook that replaced ``runner.param_schedulers`` is seen)."""

    model: nn.Module
    optim_wrapper: Any  # OptimWrapper, None when nothing trains
    param_schedulers: list
    message_hub: Any
    hooks: dict[str, Any]  # registered name -> stateful hook
    sinks: Any
    train_loop: Any  # None when nothing trains
    train_state: Any  # the loop's TrainState (its position)
    rank: int
    world_size: int
    logger: logging.Logger
    seed: int
    experiment_name: str
    cfg: Any
    strategy: Any  # checkpoint.sharded.writes_shards reads its 'checkpoint'
    pretrained_from: str | None  # the model directory load_from filled the model from
    global_batch: int | None  # samples an iteration trains over all ranks (Runner.global_batch)
    num_streams: int | None  # a StreamingLoader's streams (Runner.num_streams)
    batch_size: int | None  # train_dataloader.batch_size as configured (Runner.train_batch_size)
    pipeline: Any = None  # this rank's PipelineParts under pipeline parallelism (parallel/)

    def optimizer(self) -> Any:
        """The torch optimizer inside the wrapper, or None when nothing trains."""
        return self.optim_wrapper.optimizer if self.optim_wrapper is not None else None

    @classmethod
    def of(cls, runner: RunnerAPI) -> CheckpointSubject:
        """The one place that reads a Runner for checkpoints."""
        return cls(
            model=runner.model,
            optim_wrapper=runner.optim_wrapper,
            param_schedulers=runner.param_schedulers,
            message_hub=runner.message_hub,
            hooks=runner.stateful_hooks(),
            sinks=runner.sinks,
            train_loop=runner.train_loop,
            train_state=runner.train_state,
            rank=runner.rank,
            world_size=runner.world_size,
            logger=runner.logger,
            seed=runner.seed,
            experiment_name=runner.experiment_name,
            cfg=runner.cfg,
            strategy=runner.strategy,
            pretrained_from=runner.pretrained_from,
            global_batch=runner.global_batch,
            num_streams=runner.num_streams,
            batch_size=runner.train_batch_size,
            pipeline=getattr(runner, "pipeline", None),
        )

    def position(self) -> dict:
        """What training has completed (empty when nothing trains)."""
        return self.train_state.position() if self.train_loop is not None else {}


@dataclass(frozen=True)
class SaveOptions:
    """A save's choices: CheckpointHook's ``save_optimizer``/``save_param_scheduler``, its
    ``meta`` additions, and whether the weights go in the file (not when sharded)."""

    save_optimizer: bool = True
    save_param_scheduler: bool = True
    meta: dict | None = None
    with_weights: bool = True


@dataclass(frozen=True)
class LoadContext:
    """What every restore function may need besides the checkpoint."""

    path: str | Path
    same_world: bool  # saved with this run's number of ranks: per-rank parts apply


Collect = Callable[[CheckpointSubject, SaveOptions], Any]
Restore = Callable[[CheckpointSubject, dict, LoadContext], None]


@dataclass(frozen=True)
class Part:
    """One key of a checkpoint; see the module docstring."""

    key: str
    description: str
    present: str  # when it is in a checkpoint
    collect: Collect | None = None  # None: someone else writes it (written_by)
    restore: Restore | None = None  # None: read by another part's restore, or by written_by
    per_rank: bool = False
    written_by: str = ""  # empty: the Runner's collect_training_state
    publishable: bool = True  # CheckpointHook(published_keys=) may keep it
