"""IterTimerHook: how long each step and its data loading took, the ETA, and the throughput."""

from __future__ import annotations

import time
from collections.abc import Callable
from time import perf_counter
from typing import TYPE_CHECKING

from distributed_runner.core import dist
from distributed_runner.core.registry import HOOKS
from distributed_runner.data.global_batch import MicroBatches
from distributed_runner.engine.hook import DataBatch, Hook
from distributed_runner.engine.message_hub import MISSING
from distributed_runner.model.build import get_ori_model
from distributed_runner.tracking.throughput import ThroughputMeter

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class IterTimerHook(Hook):
    """Record ``<stage>/data_time`` (waiting for the batch) and ``<stage>/time`` (the whole
    iteration, data included) as scalars, and the training ETA in seconds as info ``eta``.

    The ETA divides the time spent since this process started training (not since the run
    started: a resumed run's first steps would otherwise be averaged with another machine's) by the
    iterations done since, times the iterations left. It is derived, not written: each step only
    notes when it ended and which iteration it was, and ``eta`` is computed from those when
    someone reads it (:meth:`~distributed_runner.engine.message_hub.MessageHub.derive_info`) — the
    value a reader gets is the one the step would have written. Ranks: all.

    Throughput (:mod:`distributed_runner.tracking.throughput`): ``train/samples_per_s`` (the run's,
    all ranks), ``train/tokens_per_s`` where the batch holds tokens, and ``train/mfu`` (a device's
    model FLOPs utilisation) where the FLOPs per token and the device's peak are known, exact over
    each logging window. ``samples_key='auto'``, ``tokens_key='auto'``, ``flops_per_token='auto'``,
    ``peak_tflops=None``: see :class:`~distributed_runner.tracking.throughput.ThroughputMeter`;
    ``samples_key=None, tokens_key=None`` turns it off.
    """

    priority = "NORMAL"
    _meter: ThroughputMeter | None = None  # a subclass that skips __init__ has none
    _eta_inputs: tuple[float, int] | None = None  # (end, iter) of the last step timed
    # the hub's writers of train/data_time and train/time (MessageHub.scalar_writer), taken at
    # before_train; None: a subclass whose before_train did not call this one's
    _write_data_time: Callable[[float], None] | None = None
    _write_time: Callable[[float], None] | None = None

    def __init__(
        self,
        samples_key: str | None = "auto",
        tokens_key: str | None = "auto",
        flops_per_token: str | float | None = "auto",
        peak_tflops: float | dict | None = None,
    ) -> None:
        self._t = 0.0
        self._train_start = 0.0
        self._start_iter = 0
        self._max_iters = 0
        meter = ThroughputMeter(samples_key, tokens_key, flops_per_token, peak_tflops)
        self._meter = meter if samples_key is not None or tokens_key is not None else None

    def before_train(self, runner: RunnerAPI) -> None:
        self._start_iter = runner.iter
        self._max_iters = runner.max_iters
        if self._meter is not None:
            self._meter.start(
                get_ori_model(runner.model),
                runner.device,
                runner.world_size,
                dist.get_tensor_parallel_size(),  # a tensor-parallel group shares its batches
            )
        self._eta_inputs = None
        hub = runner.message_hub
        hub.derive_info("eta", _EtaProvider(self))
        self._write_data_time = hub.scalar_writer("train/data_time")
        self._write_time = hub.scalar_writer("train/time")
        self._train_start = time.perf_counter()

    # MMEngine's helpers, which the base class forwards every epoch and val/test iteration to
    def _before_epoch(self, runner: RunnerAPI, mode: str = "train") -> None:
        self._t = time.perf_counter()

    def _before_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: DataBatch = None, mode: str = "train"
    ) -> None:
        runner.message_hub.update_scalar(f"{mode}/data_time", perf_counter() - self._t)

    def _after_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
        mode: str = "train",
    ) -> None:
        now = perf_counter()
        runner.message_hub.update_scalar(f"{mode}/time", now - self._t)
        self._t = now

    # training: written out, with the ETA (every step). A subclass that overrides _before_iter or
    # _after_iter (as MMEngine's downstream timers do) gets them called for training too.
    def before_train_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: DataBatch = None
    ) -> None:
        write = self._write_data_time
        if write is not None:
            write(perf_counter() - self._t)
        else:
            runner.message_hub.update_scalar("train/data_time", perf_counter() - self._t)

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
    ) -> None:
        now = perf_counter()
        seconds = now - self._t
        write = self._write_time
        if write is not None:
            write(seconds)
        else:
            runner.message_hub.update_scalar("train/time", seconds)
        self._t = now
        self._record_eta(runner, now)
        if self._meter is not None:
            self._meter.record(runner.message_hub, data_batch, seconds, trained_parts(data_batch))

    def _record_eta(self, runner: RunnerAPI, now: float) -> None:
        """The ETA's inputs of this step (a new tuple: also the provider's stamp)."""
        self._eta_inputs = (now, runner.iter)

    def eta(self) -> float | None:
        """Seconds left: time since this process started training per iteration done since,
        times the iterations left (None before the first step)."""
        if self._eta_inputs is None:
            return None
        now, it = self._eta_inputs
        return (now - self._train_start) / (it + 1 - self._start_iter) * (self._max_iters - it - 1)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "_before_iter" in vars(cls) and "before_train_iter" not in vars(cls):
            setattr(cls, "before_train_iter", Hook.before_train_iter)  # noqa: B010 - a method
        if "_after_iter" in vars(cls) and "after_train_iter" not in vars(cls):
            setattr(cls, "after_train_iter", _after_train_iter_with_eta)  # noqa: B010 - a method


class _EtaProvider:
    """``eta`` in the MessageHub, computed from its IterTimerHook when read."""

    __slots__ = ("timer",)

    def __init__(self, timer: IterTimerHook) -> None:
        self.timer = timer

    def value(self) -> object:
        eta = self.timer.eta()
        return MISSING if eta is None else eta

    def stamp(self) -> object:
        return self.timer._eta_inputs


def _after_train_iter_with_eta(
    self: IterTimerHook,
    runner: RunnerAPI,
    batch_idx: int,
    data_batch: DataBatch = None,
    outputs: dict | None = None,
) -> None:
    """A subclass's ``_after_iter`` for training, then the ETA as IterTimerHook keeps it."""
    self._after_iter(
        runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs, mode="train"
    )
    self._record_eta(runner, perf_counter())


def trained_parts(data_batch: DataBatch) -> list | None:
    """The micro-batches a step trained when its batch is several (MicroBatches), without the
    weight-0 passes that pad a rank's short share of an epoch's last global batch (they train no
    sample); None for a plain batch."""
    if type(data_batch) is not MicroBatches:
        return None
    weights = data_batch.weights or [1.0] * len(data_batch)
    return [part for part, weight in zip(data_batch, weights, strict=True) if weight]
