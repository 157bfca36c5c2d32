"""What hooks and helpers may use of the Runner: its typed public surface, as a Protocol.

Hooks, loops, the step and the dispatcher receive the Runner as ``runner``; annotating that
parameter with :class:`RunnerAPI` instead of :class:`~distributed_runner.engine.runner.Runner` says
which part of it they may rely on, and lets a type checker catch a hook reaching into ``runner._x``.
It also keeps the annotation from being an import *up* to the Runner: this module is the bottom
floor of the package's layers and imports no project module at all, not even under
``TYPE_CHECKING`` (an import contract in pyproject.toml checks it), so every module — the sinks,
the checkpoint code, the loops — may import it without closing a cycle; best under
``TYPE_CHECKING``::

    from typing import TYPE_CHECKING
    if TYPE_CHECKING:
        from distributed_runner.core.runner_api import RunnerAPI

    def after_train_iter(self, runner: RunnerAPI, batch_idx: int, ...) -> None: ...

The Runner satisfies this Protocol structurally (it does not inherit from it). Read-only
properties of the Runner are read-only here; attributes a hook may assign (``wrapped_model``,
which PrepareTTAHook swaps; ``train_dataloader``) are plain attributes. The Runner's services
(MessageHub, SinkSet, ControlRequests, OptimWrapper, TrainState, CheckpointWriter) are typed
``Any`` with their class named in a comment: importing them here would make this module depend on
modules that themselves take a ``runner``. Adding to the Runner's public surface means adding here
too; the list mirrors the Runner module's docstring.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # names for annotations only (none from the project: module docstring)
    import logging

    import torch
    from torch import nn


class RunnerAPI(Protocol):
    """The Runner as hooks see it; see the module docstring."""

    # -- configuration and identity -----------------------------------------------------------
    cfg: Any  # the Config (or a plain dict on a Ray worker) the Runner was built from
    work_dir: Path  # absolute: this run's own folder under the config's work_dir
    run_name: str  # that folder's name ('.' when it is the config's work_dir itself)
    experiment_name: str  # what the runs of one config share (the config's work_dir's name)
    timestamp: str
    launcher: Any
    rank: int
    world_size: int
    device: torch.device
    seed: int
    strategy: Any  # 'ddp' or FSDP's options (distributed_runner.model.sharding)
    settings: Any  # the config's sections, parsed once (distributed_runner.engine.sections)
    elastic_plan: Any  # data.elastic.GlobalBatchPlan of an elastic run (or resized resume)
    global_batch: int | None  # samples one iteration trains over all data-parallel ranks
    replicas: Any  # fault_tolerance.replica.ReplicaGroup of a fault-tolerant run, else None
    pipeline: Any  # parallel.pipeline.PipelineParts under pipeline parallelism, else None
    num_streams: int | None  # a StreamingLoader's streams (its order's C), else None
    train_batch_size: int | None  # train_dataloader.batch_size as configured (per rank)
    pretrained_from: str | None  # the model directory load_from filled the model from (absolute)

    # -- services -----------------------------------------------------------------------------
    logger: logging.Logger
    message_hub: Any  # engine.message_hub.MessageHub
    sinks: Any  # tracking.sinks.SinkSet: ``write(LogRecord)``
    requests: Any  # engine.requests.ControlRequests; hooks call request_stop/... instead
    checkpoints: Any  # checkpoint.writer.CheckpointWriter: ``wait()`` for a background save
    loading_for: str | None  # 'resume' / 'load_from' while after_load_checkpoint runs

    # -- what trains --------------------------------------------------------------------------
    wrapped_model: nn.Module  # what the loops call (DDP/FSDP/compiled); PrepareTTAHook swaps it
    optim_wrapper: Any  # optim.wrapper.OptimWrapper (None when nothing trains)
    param_schedulers: list
    train_dataloader: Any  # assigning replaces the loader training iterates
    val_dataloader: Any
    test_dataloader: Any
    train_loop: Any
    val_loop: Any
    val_mode: Any  # validation.async_validation.ValMode: val_cfg's mode, lag, resources
    test_loop: Any

    @property
    def model(self) -> nn.Module:
        """The unwrapped model."""

    # -- the position (one TrainState) --------------------------------------------------------
    @property
    def train_state(self) -> Any:  # engine.train_state.TrainState
        """Where training is."""

    @property
    def epoch(self) -> int:
        """0-based epoch in progress."""

    @property
    def iter(self) -> int:
        """0-based iteration in progress (advances after after_train_iter)."""

    @property
    def max_epochs(self) -> int:
        """Epochs to train (epoch-based loops)."""

    @property
    def max_iters(self) -> int:
        """Iterations to train."""

    @property
    def by_epoch(self) -> bool:
        """Whether training is epoch-based."""

    # -- hooks --------------------------------------------------------------------------------
    @property
    def hooks(self) -> list:
        """The hooks, in call order."""

    @property
    def call_hook(self) -> Callable[..., None]:
        """``call_hook(mount, **kwargs)``: run a mount point on every hook implementing it."""

    @property
    def mount_callers(self) -> dict[str, Callable[..., None]]:
        """Mount point -> its caller, kept current as hooks are disabled."""

    @property
    def step_guards(self) -> tuple:
        """The StepGuard hooks (distributed_runner.engine.extension_points), in call order."""

    def hook_bracket(self, before: str, after: str) -> AbstractContextManager[None]:
        """``before`` now, ``after`` at exit, also when the body raises."""

    def hook_plan(self) -> str:
        """The mount point table, as text."""

    def get_hook(self, name: str) -> Any:
        """The hook registered under ``name``, or None."""

    def stateful_hooks(self) -> dict[str, Any]:
        """Registered name -> hook, for hooks a checkpoint keeps the state of."""

    def hook_timings(self) -> list:
        """Cumulative time per (hook, mount point), slowest first."""

    def hook_seconds(self) -> dict[str, float]:
        """Cumulative time per registered hook name."""

    def val_metric_names(self) -> list[str] | None:
        """The keys validation will report, if its metrics declare them."""

    def replica_event(self, event: Any) -> None:
        """A fault-tolerant run's quorum changed: logged, then ``after_replica_change``."""

    # -- requests (hooks request, the loop acts) ----------------------------------------------
    def request_stop(self, reason: str) -> None:
        """End training after the current iteration, on every rank."""

    def request_checkpoint(self, reason: str) -> None:
        """Save a checkpoint after the current iteration, on every rank."""

    def request_val(self, reason: str) -> None:
        """Validate after the current iteration, on every rank."""

    def request_pause(self, reason: str) -> None:
        """Checkpoint after the current iteration and end the run unfinished, on every rank."""

    # -- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(
        self,
        out_dir: str | Path,
        filename: str,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        meta: dict | None = None,
        asynchronous: bool = False,
    ) -> Path:
        """Assemble and write a checkpoint; call it on every rank."""

    def save_requested_checkpoint(self, reason: str) -> Path:
        """Save a checkpoint for a request (through the CheckpointSaver, if any)."""

    def load_checkpoint(
        self, path: str | Path, strict: bool = True, map_location: Any = "cpu"
    ) -> dict:
        """Load model weights only."""

    def resume(self, path: str | Path, checkpoint: dict | None = None) -> dict:
        """Restore the full training state of ``path``."""

    def find_latest_checkpoint(self) -> Path | None:
        """The checkpoint ``work_dir/last_checkpoint`` points at, if any."""

    def rollback(self, reason: str) -> Path:
        """Restore the newest checkpoint on every rank."""

    # -- entry points -------------------------------------------------------------------------
    def build_dataloader(self, *args: Any, **kwargs: Any) -> Any:
        """MMEngine's Runner.build_dataloader (a seeded loader from a config)."""

    def train(self) -> nn.Module:
        """Train; returns the model."""

    def val(self) -> dict:
        """Validate; returns the metrics."""

    def test(self) -> dict:
        """Test; returns the metrics."""
