"""The training, validation and test loops — where every mount point is called.

A whole ``Runner.train()``::

    open the sinks (runner.sinks)                           # built when the Runner was built
    before_run
    (resume / load_from: after_load_checkpoint(checkpoint), then the state is restored from it)
    before_train
    step = choose_step(runner)                              # once (step_choice.py): one of
                                                            # step.py's plain, guarded, own
                                                            # train_step or elastic steps
    [validation, if the checkpoint resumed from was saved before a validation that was due]
    for epoch in range(start_epoch, max_epochs):            # EpochBasedTrainLoop
        before_train_epoch
        for batch_idx, data_batch in dataloader:            # resumed epochs skip consumed batches
            before_train_iter(batch_idx, data_batch)
            outputs = step(data_batch)                      # the values to log
            after_train_iter(batch_idx, data_batch, outputs)  # the iteration counts as done
            iter += 1                                       # runner.train_state advances
            act on requests                                 # agreed by all ranks every agree_every
                                                            # iters: checkpoint, val, stop, preempt
            if stop_training: break                         # agreed: a hook's stop_training =
                                                            # True is a stop request, as above
        after_train_epoch                                   # periodic checkpoints are saved here
        epoch += 1
        if validation is due:                               # every val_interval; the last too
            before_val; before_val_epoch                    # then the model is put in eval mode
            for batch_idx, data_batch in val_dataloader:
                before_val_iter(batch_idx, data_batch)
                outputs = predict(data_batch); evaluator.process(data_batch, outputs)
                after_val_iter(batch_idx, data_batch, outputs)
            metrics = evaluator.evaluate()                  # gathered from all ranks
            after_val_epoch(metrics)                        # save-best, early stopping
            after_val                                       # the model is back in train mode
            act on requests                                 # early stopping's stop lands here
            (val_cfg.mode='async': the due checkpoint goes to a background validation instead,
             and the results of the one due `lag` validations ago reach after_val_epoch here:
             distributed_runner.validation.async_validation; the outstanding ones are applied
             before after_train)
        if stop_training: break
    act on requests still pending                           # raised after the last agreement
    after_train                                             # also when training raised
    an async_save still being written commits               # not when training raised
    after_run                                               # also when training raised
    close the sinks                                         # also when training raised

A step guard's rollback (NonFiniteLossHook) raises out of the step: every rank restores the newest
checkpoint (``Runner.rollback``) and training goes on from its position, an epoch-based loop with
``before_train_epoch`` again. ``predict`` is the model's val_step / test_step, else its
preprocessor then ``forward(mode='predict')`` (step_choice.predictor).

Saving a checkpoint (``Runner.save_checkpoint``, checkpoint/writer.py), on every rank: the save
still in flight commits first -> sinks flushed (rank 0) -> the state collected ->
``before_save_checkpoint(checkpoint)`` -> rank 0 writes (``async_save``: a background thread) ->
``after_save_checkpoint(path, checkpoint)`` on every rank (with ``async_save`` at the commit, once
every rank's write is done; RayReportHook reports it to Ray). ``Runner.test()``: ``before_run ->
load -> before_test -> before_test_epoch -> iters -> after_test_epoch(metrics) -> after_test ->
after_run``; ``Runner.val()`` likewise. The IterBasedTrainLoop runs ``max_iters`` steps over an
endless pass of the data (reshuffled at each wrap) between one ``before_train_epoch`` /
``after_train_epoch``, validating after the iterations it is due at. In an elastic run a
data_batch is the rank's micro-batches of one global batch, and the step one optimizer step over
them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from time import monotonic
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from distributed_runner.core import dist
from distributed_runner.core.preemption import TrainingPreempted
from distributed_runner.core.registry import LOOPS
from distributed_runner.data.loaders import resume_sampler
from distributed_runner.data.world_change import sample_position
from distributed_runner.engine.config_check import check_train_cfg
from distributed_runner.engine.step import RollbackRequested
from distributed_runner.engine.step_choice import choose_step, predictor
from distributed_runner.engine.train_state import TrainState
from distributed_runner.health.heartbeat import DATA, DATA_WARMUP, HEARTBEAT, STEP, TEARDOWN, VAL
from distributed_runner.model.calling import move_to
from distributed_runner.validation.async_validation import validation_mode

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


class _EvalLoop:
    """One pass over val or test data with the matching mount points."""

    stage = ""

    def __init__(self, runner: RunnerAPI, dataloader: DataLoader, evaluator: Any) -> None:
        self.runner = runner
        self.dataloader = dataloader
        self.evaluator = evaluator
        self._names = {
            k: k.format(self.stage)
            for k in (
                "before_{}",
                "after_{}",
                "before_{}_epoch",
                "after_{}_epoch",
                "before_{}_iter",
                "after_{}_iter",
            )
        }

    def run(self) -> dict:
        runner, n = self.runner, self._names
        with runner.hook_bracket(n["before_{}"], n["after_{}"]):
            runner.call_hook(n["before_{}_epoch"])
            # taken after the before_* hooks: a model they swapped in (PrepareTTAHook) is the one
            # put in eval mode and called
            model, self._predict = runner.wrapped_model, predictor(runner, self.stage)
            was_training = model.training
            model.eval()
            try:
                with torch.no_grad():
                    for batch_idx, data_batch in enumerate(self.dataloader):
                        self.run_iter(batch_idx, data_batch)
                metrics = self.evaluator.evaluate(len(self.dataloader.dataset))  # type: ignore[arg-type]
                runner.call_hook(n["after_{}_epoch"], metrics=metrics)
            finally:
                model.train(was_training)
        return metrics

    def run_iter(self, batch_idx: int, data_batch: Any) -> None:
        runner, n = self.runner, self._names
        runner.call_hook(n["before_{}_iter"], batch_idx=batch_idx, data_batch=data_batch)
        if runner.device.type != "cpu":
            data_batch = move_to(data_batch, runner.device)
        outputs = self._predict(data_batch)  # step_choice.predictor: val_step / test_step
        self.evaluator.process(data_batch, outputs)
        runner.call_hook(
            n["after_{}_iter"], batch_idx=batch_idx, data_batch=data_batch, outputs=outputs
        )


@LOOPS.register_module()
class ValLoop(_EvalLoop):
    """Validation: ``before_val`` ... ``after_val_epoch(metrics)`` ... ``after_val``."""

    stage = "val"


@LOOPS.register_module()
class TestLoop(_EvalLoop):
    """Testing: ``before_test`` ... ``after_test_epoch(metrics)`` ... ``after_test``."""

    stage = "test"


class _TrainLoopBase:
    """What both training loops share: the constructor, the run preamble and ending, one
    iteration and requests. Their position is a :class:`TrainState`
    (``self.state``, also ``runner.train_state``)."""

    by_epoch = True

    def __init__(
        self,
        runner: RunnerAPI,
        dataloader: DataLoader,
        max_epochs: int | None = None,
        max_iters: int | None = None,
        val_begin: int = 1,
        val_interval: int = 1,
        agree_every: int | str = "auto",
    ) -> None:
        self.runner = runner
        self.dataloader = dataloader
        self.val_begin = int(val_begin)
        self.val_interval = int(val_interval)
        self._stop_agreed = False  # the ranks agreed to stop: see stop_training
        length = {"max_epochs": max_epochs} if self.by_epoch else {"max_iters": max_iters}
        check_train_cfg({**length, "agree_every": agree_every})  # also for a Runner built in Python
        if self.by_epoch:
            max_iters = int(max_epochs or 0) * len(dataloader)
        else:
            max_epochs = 1
        self.state = TrainState(
            max_epochs=int(max_epochs or 0), max_iters=int(max_iters or 0), by_epoch=self.by_epoch
        )
        self._skip_by_iterating = 0  # consumed batches a sampler without resume_at cannot skip
        self._agree = dist.is_distributed()  # ranks must agree on requests
        # the hot path, looked up once: the mount points' callers, and the step (when training
        # starts: a bound method, which costs less to call than the strategy object)
        self._callers = runner.mount_callers
        self.step: Callable[[Any], dict] | None = None
        self._beat = HEARTBEAT  # the watchdog's view of this loop (health/heartbeat.py)
        self._async_val: Any = None  # val_cfg.mode='async': the run's AsyncValidation
        runner.requests.set_agree_every(agree_every)

    @property
    def stop_training(self) -> bool:
        """MMEngine's flag: True once the ranks have agreed to end training after this step."""
        return self._stop_agreed

    @stop_training.setter
    def stop_training(self, value: bool) -> None:
        """A hook's ``stop_training = True`` is a stop request (:mod:`.requests`): every rank
        ends at the same agreement point, after this iteration or validation in one process.
        MMEngine ends the rank that set it at once, which splits a distributed run (a hook that
        reads a flag file or a metric on rank 0 only: the other ranks wait in a collective it
        never enters). Setting False does not take back a request or an agreed stop."""
        if value and not self._stop_agreed:
            self.runner.request_stop("train_loop.stop_training = True")

    # MMEngine's loops expose these (read-only views of the state); hooks read the runner's
    epoch = property(lambda self: self.state.epoch)
    iter = property(lambda self: self.state.iter)
    max_epochs = property(lambda self: self.state.max_epochs)
    max_iters = property(lambda self: self.state.max_iters)

    def resume_from(self, position: dict) -> None:
        """Continue after ``position`` (from a checkpoint's meta): at its data pass's sample
        position, in this run's global batches (another global batch than the checkpoint's: a
        resume that asked for one, data/world_change.py)."""
        state = self.state
        state.restore(position)
        samples, size = sample_position(position), self.runner.global_batch
        if samples is not None and size:
            state.batch_in_epoch, state.epoch_offset = divmod(samples, size)
        if (
            not resume_sampler(
                self.dataloader, state.data_epoch, state.batch_in_epoch, state.epoch_offset
            )
            and state.batch_in_epoch
        ):
            self.runner.logger.warning(
                "train_dataloader's sampler cannot start mid-epoch; the consumed batches of "
                "this epoch are skipped by iterating over them (use DefaultSampler to avoid it)"
            )
            self._skip_by_iterating = state.batch_in_epoch

    def _val_due(self, done: int) -> bool:
        """After ``done`` epochs (iters): every val_interval from val_begin, and the last."""
        last = self.state.max_epochs if self.by_epoch else self.state.max_iters
        return (
            self.runner.val_loop is not None
            and self.val_interval > 0
            and done >= self.val_begin
            and (done % self.val_interval == 0 or done == last)
        )

    def _due_validation(self) -> None:
        """A due validation: run here, or (val_cfg.mode='async') handed over, see
        validation/async_validation.py."""
        if self._async_val is not None:
            self._async_val.at_due_point()
        else:
            self._validate()

    def _validate(self) -> None:
        if self.runner.val_loop is not None:
            with self._beat.slow(VAL):
                self.runner.val_loop.run()
            self.runner.wrapped_model.train()

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> None:
        """``before_train``, a validation the resumed checkpoint still owed, the training, the
        requests still pending at its end, ``after_train`` (also when training raised)."""
        with (
            self.runner.hook_bracket("before_train", "after_train"),
            # validation/async_validation.py; None: in-loop
            validation_mode(self) as self._async_val,
        ):
            self.step = choose_step(self.runner).__call__
            if self.state.val_owed:
                self.state.val_owed = False
                self._due_validation()
            self.run_training()
            # requests raised after the last agreement point (agree_every > 1), or at the last
            # after_train_epoch, are acted on once more before training ends
            if self._agree or self.runner.requests.unresolved:
                self.act_on_requests()
            self._beat.mark(TEARDOWN)

    def run_training(self) -> None:
        raise NotImplementedError

    def run_iter(self, batch_idx: int, data_batch: Any, val_due: bool = False) -> None:
        runner, state, callers = self.runner, self.state, self._callers
        beat = self._beat  # Heartbeat.stepping() written out: one iteration stays in the
        beat.phase, beat.t = beat.step_phase, monotonic()  # loop, step and dispatch files
        callers["before_train_iter"](batch_idx=batch_idx, data_batch=data_batch)
        outputs = self.step(data_batch)  # type: ignore[misc]  # chosen before training starts
        # the iteration's end, written out here only (it runs every iteration): while
        # after_train_iter runs the iteration counts as done (TrainState.position), then the
        # next one is in progress
        state.finishing_step, state.val_due_after = "iter", val_due
        callers["after_train_iter"](batch_idx=batch_idx, data_batch=data_batch, outputs=outputs)
        state.finishing_step, state.val_due_after = None, False
        state.iter += 1
        state.batch_in_epoch += 1
        beat.iter, beat.phase, beat.t = state.iter, DATA, monotonic()  # Heartbeat.stepped()
        if beat.carry is not None or beat.step_phase is not STEP:
            beat.end_carry()  # the first iteration after a slow phase
        if self._agree:
            if runner.requests.due(state.iter):
                self.act_on_requests(after_iter=True)
        elif runner.requests.unresolved:
            self.act_on_requests()

    def act_on_requests(self, allow_val: bool = True, after_iter: bool = False) -> None:
        """Resolve requests across ranks (collective when distributed) and act on them."""
        runner = self.runner
        agreed = (
            runner.requests.resolve_after_iter(runner.logger)
            if after_iter
            else runner.requests.resolve()
        )
        if not agreed:
            return
        record, done = runner.requests.record, self.state.iter
        if "checkpoint" in agreed or "preempt" in agreed:
            reasons = agreed.get("preempt", ()) + agreed.get("checkpoint", ())
            record(done, "checkpoint", reasons, runner.logger)
            path = runner.save_requested_checkpoint("; ".join(reasons))
            if "preempt" in agreed:
                record(done, "preempt", agreed["preempt"], runner.logger)
                raise TrainingPreempted(agreed["preempt"], path, iteration=done)
        if "val" in agreed:
            if runner.val_loop is None or not allow_val:
                runner.logger.warning(
                    "validation requested (%s) but %s",
                    "; ".join(agreed["val"]),
                    "no val_dataloader is configured"
                    if runner.val_loop is None
                    else "a validation just ran",
                )
            else:
                record(done, "val", agreed["val"], runner.logger)
                self._due_validation()
                self.act_on_requests(allow_val=False)  # what that validation requested
        if "stop" in agreed:
            record(done, "stop", agreed["stop"], runner.logger)
            self._stop_agreed = True

    def rollback(self, request: RollbackRequested) -> None:
        """Restore the newest checkpoint on every rank and let the guard adjust (LR scale)."""
        self.runner.rollback(request.reason)
        request.guard.on_rollback(self.runner)

    def _batches(self) -> Iterator[tuple[int, Any]]:
        """This data pass's remaining batches with their in-pass index."""
        self._beat.mark(DATA_WARMUP)  # its first batch may take long (workers fork, Ray Data)
        it, skip, self._skip_by_iterating = iter(self.dataloader), self._skip_by_iterating, 0
        for _ in range(skip):
            next(it, None)
        return enumerate(it, start=self.state.batch_in_epoch)


@LOOPS.register_module()
class EpochBasedTrainLoop(_TrainLoopBase):
    """``max_epochs`` passes over the training data; validation every ``val_interval`` epochs."""

    by_epoch = True

    def __init__(
        self,
        runner: RunnerAPI,
        dataloader: DataLoader,
        max_epochs: int,
        val_begin: int = 1,
        val_interval: int = 1,
        agree_every: int | str = "auto",
    ) -> None:
        super().__init__(
            runner,
            dataloader,
            max_epochs=max_epochs,
            val_begin=val_begin,
            val_interval=val_interval,
            agree_every=agree_every,
        )

    def run_training(self) -> None:
        state = self.state
        while state.epoch < state.max_epochs and not self.stop_training:
            try:
                self.run_epoch()
            except RollbackRequested as request:
                self.rollback(request)

    def run_epoch(self) -> None:
        runner, state = self.runner, self.state
        runner.call_hook("before_train_epoch")
        runner.wrapped_model.train()
        for batch_idx, data_batch in self._batches():
            self.run_iter(batch_idx, data_batch)
            if self.stop_training:
                break
        val_due = self._val_due(state.epoch + 1)
        state.finishing("epoch", val_due)
        runner.call_hook("after_train_epoch")
        state.epoch_done()
        if val_due:
            self._due_validation()
            self.act_on_requests(allow_val=False)


class _EndlessBatches:
    """Batches forever: each pass is a data epoch; the sampler reshuffles at each wrap."""

    def __init__(self, loop: IterBasedTrainLoop) -> None:
        self.loop = loop
        self._it: Iterator | None = None

    def next(self) -> Any:
        loop, state = self.loop, self.loop.state
        while True:
            if self._it is None:
                sampler = getattr(loop.dataloader, "sampler", None)
                set_epoch = getattr(sampler, "set_epoch", None)
                if set_epoch is not None:
                    set_epoch(state.data_epoch)
                self._it = loop._batches()
            item = next(self._it, None)
            if item is not None:
                return item[1]
            self._it = None
            state.next_data_pass()


@LOOPS.register_module()
class IterBasedTrainLoop(_TrainLoopBase):
    """``max_iters`` steps over an endless pass of the data; validation every ``val_interval``."""

    by_epoch = False

    def __init__(
        self,
        runner: RunnerAPI,
        dataloader: DataLoader,
        max_iters: int,
        val_begin: int = 1,
        val_interval: int = 1000,
        agree_every: int | str = "auto",
    ) -> None:
        super().__init__(
            runner,
            dataloader,
            max_iters=max_iters,
            val_begin=val_begin,
            val_interval=val_interval,
            agree_every=agree_every,
        )

    def run_training(self) -> None:
        runner, state = self.runner, self.state
        batches = _EndlessBatches(self)
        runner.call_hook("before_train_epoch")
        runner.wrapped_model.train()
        while state.iter < state.max_iters and not self.stop_training:
            data_batch = batches.next()
            val_due = self._val_due(state.iter + 1)
            # as in MMEngine, an iteration-based loop's batch_idx is the global iteration
            try:
                self.run_iter(state.iter, data_batch, val_due)
            except RollbackRequested as request:
                self.rollback(request)
                batches = _EndlessBatches(self)
                continue
            if val_due:
                self._due_validation()
                self.act_on_requests(allow_val=False)
        state.finishing("epoch")
        runner.call_hook("after_train_epoch")
        state.epoch_done()
