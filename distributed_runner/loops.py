"""The training, validation and test loops — where every mount point is called.

A whole ``Runner.train()``::

    before_run
    (resume / load_from)                       -> after_load_checkpoint(checkpoint)
    before_train
    [validation, if the checkpoint resumed from was saved before a validation that was due]
    for epoch in range(start_epoch, max_epochs):            # EpochBasedTrainLoop
        before_train_epoch
        for batch_idx, data_batch in dataloader:            # resumed epochs skip consumed batches
            before_train_iter(batch_idx, data_batch)
            outputs = train_step(data_batch)                # forward(mode='loss'), step guards
                                                            # (agreed by all ranks), backward, step
            after_train_iter(batch_idx, data_batch, outputs)
            iter += 1
            act on requests                                 # agreed by all ranks (every
                                                            # train_cfg.agree_every iterations):
                                                            # checkpoint, validation, stop, preempt
            if stop_training: break
        after_train_epoch                                   # periodic checkpoints are saved here
        epoch += 1
        if validation is due:                               # every val_interval epochs from val_begin
            before_val; before_val_epoch
            for batch_idx, data_batch in val_dataloader:
                before_val_iter(batch_idx, data_batch)
                outputs = predict_step(data_batch); evaluator.process(data_batch, outputs)
                after_val_iter(batch_idx, data_batch, outputs)
            metrics = evaluator.evaluate()                   # gathered from all ranks
            after_val_epoch(metrics)                         # save-best, early stopping
            after_val
            act on requests                                 # early stopping's stop lands here
        if stop_training: break
    after_train                                             # also when training raised
    after_run                                               # also when training raised

A step guard that rejects the step (NonFiniteLossHook) skips backward and step on every rank, or
rolls every rank back to the newest checkpoint, where the loop continues.

``before_save_checkpoint(checkpoint)`` fires inside ``Runner.save_checkpoint`` wherever a hook
saves. ``Runner.test()`` is ``before_run -> load -> before_test -> before_test_epoch -> iters ->
after_test_epoch(metrics) -> after_test -> after_run``; ``Runner.val()`` likewise.

The IterBasedTrainLoop runs ``max_iters`` steps over an endless pass of the data (the sampler
reshuffles at each wrap), calls ``before_train_epoch``/``after_train_epoch`` once around them, and
validates every ``val_interval`` iterations.
"""
from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from . import dist
from .data import resume_sampler
from .errors import ConfigError
from .preemption import TrainingPreempted
from .registry import LOOPS


class RollbackRequested(Exception):
    """Raised inside the step when a step guard asks for a rollback; the loop restores."""

    def __init__(self, guard: Any, reason: str) -> None:
        super().__init__(reason)
        self.guard, self.reason = guard, reason


def move_to(data: Any, device: torch.device) -> Any:
    """Tensors in ``data`` (dicts, lists, tuples) moved to ``device``."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, dict):
        return {k: move_to(v, device) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(move_to(v, device) for v in data)
    return data


def call_model(model: Any, data: Any, mode: str) -> Any:
    """DESIGN §5: a dict batch is passed as keyword arguments, a tuple/list as positional ones."""
    if isinstance(data, dict):
        return model(**data, mode=mode)
    if isinstance(data, (list, tuple)):
        return model(*data, mode=mode)
    return model(data, mode=mode)


def parse_losses(losses: dict) -> tuple[torch.Tensor, dict]:
    """The sum of every entry whose key contains ``loss``, and all entries detached for logging."""
    if not isinstance(losses, dict):
        raise TypeError(f"forward(mode='loss') must return a dict of tensors, got "
                        f"{type(losses).__name__}")
    log_vars: dict[str, Any] = {}
    total = None
    n_losses = 0
    for key, value in losses.items():
        if isinstance(value, (list, tuple)):
            value = sum(v.mean() for v in value)
        elif value.dim():
            value = value.mean()
        log_vars[key] = value.detach()
        if "loss" in key:
            total = value if total is None else total + value
            n_losses += 1
    if total is None:
        raise ValueError(f"forward(mode='loss') returned no key containing 'loss' "
                         f"(keys: {', '.join(losses)})")
    if n_losses == 1 and "loss" in log_vars:  # the common case: log_vars['loss'] is the total
        return total, log_vars
    return total, {"loss": total.detach(), **log_vars}


class _TrainLoopBase:
    """Shared state of both training loops: counters, resume position, the train step."""

    def __init__(self, runner: Any, dataloader: DataLoader, val_begin: int = 1,
                 val_interval: int = 1, agree_every: int | str = "auto") -> None:
        self.runner = runner
        self.dataloader = dataloader
        self.val_begin = int(val_begin)
        self.val_interval = int(val_interval)
        self.stop_training = False  # MMEngine's flag: set it to end training after this step
        self._epoch = 0
        self._iter = 0
        self._batch_in_epoch = 0  # completed batches of the current epoch
        self._pending: str | None = None  # 'iter' / 'epoch' while its after_* hooks run
        self._resume_val = False
        self._skip_by_iterating = 0  # consumed batches a sampler without resume_at cannot skip
        # objects with check_loss(loss) -> bool and reject_step(runner, loss) -> 'skip' |
        # 'rollback' (or raise); NonFiniteLossHook adds itself here
        self.step_guards: list = []
        self._agree = dist.is_distributed()  # ranks must agree on requests and step guards
        runner.requests.set_agree_every(agree_every)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def iter(self) -> int:
        return self._iter

    def position(self) -> dict:
        """What has been completed, as a checkpoint records it (exact at any mount point)."""
        if self._pending == "iter":
            return {"epoch": self._epoch, "iter": self._iter + 1,
                    "iter_in_epoch": self._batch_in_epoch + 1,
                    "val_pending": self._val_due_after_iter()}
        if self._pending == "epoch":
            return {"epoch": self._epoch + 1, "iter": self._iter, "iter_in_epoch": 0,
                    "val_pending": self._val_due_after_epoch()}
        return {"epoch": self._epoch, "iter": self._iter, "iter_in_epoch": self._batch_in_epoch,
                "val_pending": False}

    def resume_from(self, position: dict) -> None:
        """Continue after ``position`` (from a checkpoint's meta)."""
        self._epoch = int(position["epoch"])
        self._iter = int(position["iter"])
        self._batch_in_epoch = int(position.get("iter_in_epoch", 0))
        self._resume_val = bool(position.get("val_pending", False))
        if not resume_sampler(self.dataloader, self._epoch, self._batch_in_epoch) \
                and self._batch_in_epoch:
            self.runner.logger.warning(
                "train_dataloader's sampler cannot start mid-epoch; the consumed batches of "
                "this epoch are skipped by iterating over them (use DefaultSampler to avoid it)")
            self._skip_by_iterating = self._batch_in_epoch

    def _val_due_after_epoch(self) -> bool:
        return False

    def _val_due_after_iter(self) -> bool:
        return False

    def _validate(self) -> None:
        if self.runner.val_loop is not None:
            self.runner.val_loop.run()

    def run_iter(self, batch_idx: int, data_batch: Any) -> None:
        runner = self.runner
        call = runner.call_hook
        call("before_train_iter", batch_idx=batch_idx, data_batch=data_batch)
        outputs = self.train_step(data_batch)
        self._pending = "iter"
        call("after_train_iter", batch_idx=batch_idx, data_batch=data_batch, outputs=outputs)
        self._pending = None
        self._iter += 1
        self._batch_in_epoch += 1
        if self._agree:
            if runner.requests.due(self._iter):
                self.act_on_requests(after_iter=True)
        elif runner.requests.pending:
            self.act_on_requests()

    def act_on_requests(self, allow_val: bool = True, after_iter: bool = False) -> None:
        """Resolve requests across ranks (collective when distributed) and act on them."""
        runner = self.runner
        agreed = runner.requests.resolve_after_iter(runner.logger) if after_iter \
            else runner.requests.resolve()
        if not agreed:
            return
        record = runner.requests.record
        if "checkpoint" in agreed or "preempt" in agreed:
            reasons = agreed.get("preempt", ()) + agreed.get("checkpoint", ())
            record(self._iter, "checkpoint", reasons, runner.logger)
            path = runner.save_requested_checkpoint("; ".join(reasons))
            if "preempt" in agreed:
                record(self._iter, "preempt", agreed["preempt"], runner.logger)
                raise TrainingPreempted(agreed["preempt"], path)
        if "val" in agreed:
            if runner.val_loop is None or not allow_val:
                runner.logger.warning("validation requested (%s) but %s", "; ".join(agreed["val"]),
                                      "no val_dataloader is configured" if runner.val_loop is None
                                      else "a validation just ran")
            else:
                record(self._iter, "val", agreed["val"], runner.logger)
                self._validate()
                runner.wrapped_model.train()
                self.act_on_requests(allow_val=False)  # what that validation requested
        if "stop" in agreed:
            record(self._iter, "stop", agreed["stop"], runner.logger)
            self.stop_training = True

    def rollback(self, request: RollbackRequested) -> None:
        """Restore the newest checkpoint on every rank and let the guard adjust (LR scale)."""
        self.runner.rollback(request.reason)
        request.guard.on_rollback(self.runner)

    def train_step(self, data_batch: Any) -> dict:
        runner = self.runner
        model = runner.wrapped_model
        optim_wrapper = runner.optim_wrapper
        if runner.device.type != "cpu":
            data_batch = move_to(data_batch, runner.device)
        with optim_wrapper.optim_context(model):
            losses = call_model(model, data_batch, "loss")
        loss, log_vars = parse_losses(losses)
        if self.step_guards and not self._step_allowed(loss):
            optim_wrapper.skip_update()
            log_vars["skipped_steps"] = 1.0
            return log_vars
        optim_wrapper.update_params(loss)
        if optim_wrapper.last_grad_norm is not None:
            log_vars["grad_norm"] = optim_wrapper.last_grad_norm
            optim_wrapper.last_grad_norm = None
        return log_vars

    def _step_allowed(self, loss: torch.Tensor) -> bool:
        """Every guard's verdict, combined over ranks (one all-reduce MIN when distributed)."""
        verdicts = [bool(guard.check_loss(loss)) for guard in self.step_guards]
        if self._agree:
            verdicts = [bool(v) for v in dist.all_reduce(
                torch.tensor(verdicts, dtype=torch.int32), "min").tolist()]
        for guard, ok in zip(self.step_guards, verdicts):
            if not ok:
                action = guard.reject_step(self.runner, loss)
                if action == "rollback":
                    raise RollbackRequested(guard, f"{type(guard).__name__} at iteration "
                                                   f"{self._iter + 1}")
                return False
        return True

    def _batches(self) -> Iterator[tuple[int, Any]]:
        """This epoch's remaining batches with their in-epoch index."""
        start = self._batch_in_epoch
        it = iter(self.dataloader)
        for _ in range(self._skip_by_iterating):
            next(it, None)
        self._skip_by_iterating = 0
        return enumerate(it, start=start)


@LOOPS.register_module()
class EpochBasedTrainLoop(_TrainLoopBase):
    """``max_epochs`` passes over the training data; validation every ``val_interval`` epochs."""

    by_epoch = True

    def __init__(self, runner: Any, dataloader: DataLoader, max_epochs: int, val_begin: int = 1,
                 val_interval: int = 1, agree_every: int | str = "auto") -> None:
        super().__init__(runner, dataloader, val_begin, val_interval, agree_every)
        if int(max_epochs) < 1:
            raise ConfigError("train_cfg.max_epochs", "must be >= 1")
        self._max_epochs = int(max_epochs)
        self._max_iters = self._max_epochs * len(dataloader)

    @property
    def max_epochs(self) -> int:
        return self._max_epochs

    @property
    def max_iters(self) -> int:
        return self._max_iters

    def _val_due_after_epoch(self) -> bool:
        done = self._epoch + 1
        return (self.runner.val_loop is not None and self.val_interval > 0
                and done >= self.val_begin and done % self.val_interval == 0)

    def run(self) -> None:
        runner = self.runner
        with runner.hook_bracket("before_train", "after_train"):
            if self._resume_val:
                self._resume_val = False
                self._validate()
            while self._epoch < self._max_epochs and not self.stop_training:
                try:
                    self.run_epoch()
                except RollbackRequested as request:
                    self.rollback(request)

    def run_epoch(self) -> None:
        runner = self.runner
        runner.call_hook("before_train_epoch")
        runner.wrapped_model.train()
        for batch_idx, data_batch in self._batches():
            self.run_iter(batch_idx, data_batch)
            if self.stop_training:
                break
        val_due = self._val_due_after_epoch()
        self._pending = "epoch"
        runner.call_hook("after_train_epoch")
        self._pending = None
        self._epoch += 1
        self._batch_in_epoch = 0
        if val_due:
            self._validate()
            self.act_on_requests(allow_val=False)


class _EndlessBatches:
    """Batches forever: each pass is a data epoch; the sampler reshuffles at each wrap."""

    def __init__(self, loop: "IterBasedTrainLoop") -> None:
        self.loop = loop
        self._it: Iterator | None = None

    def next(self) -> Any:
        loop = self.loop
        while True:
            if self._it is None:
                sampler = getattr(loop.dataloader, "sampler", None)
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(loop.data_epoch)
                self._it = loop._batches()
            item = next(self._it, None)
            if item is not None:
                return item[1]
            self._it = None
            loop.data_epoch += 1
            loop._batch_in_epoch = 0


@LOOPS.register_module()
class IterBasedTrainLoop(_TrainLoopBase):
    """``max_iters`` steps over an endless pass of the data; validation every ``val_interval``."""

    by_epoch = False

    def __init__(self, runner: Any, dataloader: DataLoader, max_iters: int, val_begin: int = 1,
                 val_interval: int = 1000, agree_every: int | str = "auto") -> None:
        super().__init__(runner, dataloader, val_begin, val_interval, agree_every)
        if int(max_iters) < 1:
            raise ConfigError("train_cfg.max_iters", "must be >= 1")
        self._max_iters = int(max_iters)
        self.data_epoch = 0

    @property
    def max_epochs(self) -> int:
        return 1

    @property
    def max_iters(self) -> int:
        return self._max_iters

    def position(self) -> dict:
        pos = super().position()
        pos["epoch"] = self.data_epoch  # the data pass the sampler is in
        return pos

    def resume_from(self, position: dict) -> None:
        super().resume_from(position)
        self.data_epoch = self._epoch
        self._epoch = 0

    def _val_due_after_iter(self) -> bool:
        done = self._iter + 1
        return (self.runner.val_loop is not None and self.val_interval > 0
                and done >= self.val_begin and done % self.val_interval == 0)

    def run(self) -> None:
        runner = self.runner
        batches = _EndlessBatches(self)
        with runner.hook_bracket("before_train", "after_train"):
            if self._resume_val:
                self._resume_val = False
                self._validate()
            runner.call_hook("before_train_epoch")
            runner.wrapped_model.train()
            while self._iter < self._max_iters and not self.stop_training:
                data_batch = batches.next()
                val_due = self._val_due_after_iter()
                # as in MMEngine, an iteration-based loop's batch_idx is the global iteration
                try:
                    self.run_iter(self._iter, data_batch)
                except RollbackRequested as request:
                    self.rollback(request)
                    batches = _EndlessBatches(self)
                    continue
                if val_due:
                    self._validate()
                    runner.wrapped_model.train()
                    self.act_on_requests(allow_val=False)
            self._pending = "epoch"
            runner.call_hook("after_train_epoch")
            self._pending = None


class _EvalLoop:
    """One pass over val or test data with the matching mount points."""

    stage = ""

    def __init__(self, runner: Any, dataloader: DataLoader, evaluator: Any) -> None:
        self.runner = runner
        self.dataloader = dataloader
        self.evaluator = evaluator
        self._names = {k: k.format(self.stage) for k in
                       ("before_{}", "after_{}", "before_{}_epoch", "after_{}_epoch",
                        "before_{}_iter", "after_{}_iter")}

    def run(self) -> dict:
        runner, n = self.runner, self._names
        model = runner.wrapped_model
        was_training = model.training
        with runner.hook_bracket(n["before_{}"], n["after_{}"]):
            runner.call_hook(n["before_{}_epoch"])
            model.eval()
            with torch.no_grad():
                for batch_idx, data_batch in enumerate(self.dataloader):
                    self.run_iter(batch_idx, data_batch)
            metrics = self.evaluator.evaluate(len(self.dataloader.dataset))
            runner.call_hook(n["after_{}_epoch"], metrics=metrics)
        model.train(was_training)
        return metrics

    def run_iter(self, batch_idx: int, data_batch: Any) -> None:
        runner, n = self.runner, self._names
        runner.call_hook(n["before_{}_iter"], batch_idx=batch_idx, data_batch=data_batch)
        if runner.device.type != "cpu":
            data_batch = move_to(data_batch, runner.device)
        outputs = call_model(runner.wrapped_model, data_batch, "predict")
        self.evaluator.process(data_batch, outputs)
        runner.call_hook(n["after_{}_iter"], batch_idx=batch_idx, data_batch=data_batch,
                         outputs=outputs)


@LOOPS.register_module()
class ValLoop(_EvalLoop):
    """Validation: ``before_val`` ... ``after_val_epoch(metrics)`` ... ``after_val``."""

    stage = "val"


@LOOPS.register_module()
class TestLoop(_EvalLoop):
    """Testing: ``before_test`` ... ``after_test_epoch(metrics)`` ... ``after_test``."""

    stage = "test"
