"""One training step: what the training loop calls once per iteration, ``outputs = step(batch)``.

Which step a run takes is decided once, when training starts (after ``before_train``, whose hooks
may still change the model or the OptimWrapper), by ``step_choice.choose_step``. Every step takes
one batch and returns the iteration's ``outputs``, the values to log (``loss`` ...), detached:

==================  ==============================================================================
PlainStep           a plain model, a plain OptimWrapper (``OptimWrapper.is_plain()``) and no
                    step guards: forward, parse, backward, ``optimizer.step()``, ``zero_grad``
                    and nothing else. The common case, so the cheapest: its lines are the
                    iteration's Python cost
GuardedStep         the general step: the forward pass under the OptimWrapper's context (after the
                    model's ``data_preprocessor``, if it has one), the losses parsed, the step
                    guards' verdict agreed over the ranks, the update, the gradient norm logged
OwnTrainStep        a model's own ``train_step(data, optim_wrapper)`` (MMEngine's), its gradients
                    averaged over the ranks under DDP
ElasticStep         an elastic run (data/elastic.py), or one resumed at another world size
                    (data/world_change.py): one update over this rank's micro-batches of one
                    global batch, their losses weighted when the shares are unequal
WithWeightedTail    another step, and ElasticStep for the last, smaller global batch of an epoch
                    on several ranks (StreamingLoader's, or DefaultSampler's re-cut by
                    data/elastic.py's exact_epochs: the ranks' shares differ by a sample)
==================  ==============================================================================

How a batch reaches the model and how its losses are read is
:mod:`distributed_runner.model.calling`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import torch

from distributed_runner.core import dist
from distributed_runner.data.global_batch import MicroBatches
from distributed_runner.model.calling import (
    call_for_loss,
    call_model,
    move_to,
    parse_losses,
)

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


class StepStrategy(Protocol):
    """One training iteration's work on one batch; returns the values to log."""

    def __call__(self, data_batch: Any) -> dict: ...


class RollbackRequested(Exception):
    """Raised inside the step when a step guard asks for a rollback; the loop restores."""

    def __init__(self, guard: Any, reason: str) -> None:
        super().__init__(reason)
        self.guard, self.reason = guard, reason


def detached(log_vars: Any) -> dict:
    """A model's own log values (its train_step's or parse_losses') as the logs take them."""
    if not isinstance(log_vars, dict):
        raise TypeError(
            f"train_step must return a dict of values to log, got {type(log_vars).__name__}"
        )
    return {k: v.detach() if torch.is_tensor(v) else v for k, v in log_vars.items()}


def detaching(parse: Callable) -> Callable[[Any], tuple[torch.Tensor, dict]]:
    """``parse`` (a model's own ``parse_losses``) with its log values :func:`detached`."""

    def parse_and_detach(losses: Any) -> tuple[torch.Tensor, dict]:
        loss, log_vars = parse(losses)
        return loss, detached(log_vars)

    return parse_and_detach


def with_grad_norm(optim_wrapper: Any, log_vars: dict) -> dict:
    """``log_vars`` with the gradient norm the OptimWrapper's clipping measured in this step
    (``grad_norm``), taken so that it is logged once."""
    if optim_wrapper.last_grad_norm is not None:
        log_vars["grad_norm"] = optim_wrapper.last_grad_norm
        optim_wrapper.last_grad_norm = None
    return log_vars


def guards_allow(runner: RunnerAPI, loss: torch.Tensor, guards: tuple, agree: bool) -> bool:
    """Every step guard's verdict on ``loss``, combined over the ranks when ``agree`` (one
    all-reduce MIN, so that every rank takes the same branch). The first guard that said no
    decides: 'skip' (False: no backward, no step), 'rollback' (raises RollbackRequested), or it
    raises itself."""
    verdicts = [bool(guard.check_loss(loss)) for guard in guards]
    if agree:
        verdicts = [
            bool(v)
            for v in dist.all_reduce(torch.tensor(verdicts, dtype=torch.int32), "min").tolist()
        ]
    for guard, ok in zip(guards, verdicts, strict=True):
        if not ok:
            action = guard.reject_step(runner, loss)
            if action == "rollback":
                raise RollbackRequested(
                    guard, f"{type(guard).__name__} at iteration {runner.iter + 1}"
                )
            return False
    return True


# -- the strategies ------------------------------------------------------------------------------
class PlainStep:
    """Forward, parse, backward, ``optimizer.step()``, ``zero_grad``: what
    ``OptimWrapper.update_params`` does for a plain wrapper (no context around the forward pass,
    no accumulation, no clipping so no gradient norm), written out because it runs every
    iteration of most runs; with no step guards to ask. ``call``/``parse``: for a model taken as
    it is (:func:`~distributed_runner.model.calling.call_as_is`,
    :class:`~distributed_runner.model.calling.LossOf`); None for MMEngine's convention, inlined."""

    def __init__(
        self,
        runner: RunnerAPI,
        call: Callable[[Any, Any], Any] | None = None,
        parse: Callable[[Any], tuple[torch.Tensor, dict]] | None = None,
    ) -> None:
        self.runner, self.call, self.parse = runner, call, parse
        self.to_device = runner.device.type != "cpu"

    def __call__(self, data_batch: Any) -> dict:
        runner = self.runner
        if self.to_device:
            data_batch = move_to(data_batch, runner.device)
        if self.call is None:  # MMEngine's convention: the common case, as cheap as it gets
            if type(data_batch) is dict:
                losses = runner.wrapped_model(**data_batch, mode="loss")
            else:
                losses = call_model(runner.wrapped_model, data_batch, "loss")
            loss, log_vars = parse_losses(losses)
        else:
            # both are given together (__init__)
            loss, log_vars = self.parse(self.call(runner.wrapped_model, data_batch))  # type: ignore[misc]
        loss.backward()
        optimizer = runner.optim_wrapper.optimizer
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return log_vars


class GuardedStep:
    """The general step (module docstring). ``preprocess``: the model's data_preprocessor, called
    with ``training=True``; ``parse``: losses -> (the loss to optimize, the values to log);
    ``call``: (model, batch) -> losses (``mode='loss'``, or
    :func:`~distributed_runner.model.calling.call_as_is`). A step some guard rejects is counted by
    the OptimWrapper, not taken, and logged as ``skipped_steps``."""

    def __init__(
        self,
        runner: RunnerAPI,
        preprocess: Callable | None = None,
        parse: Callable[[Any], tuple[torch.Tensor, dict]] = parse_losses,
        call: Callable[[Any, Any], Any] = call_for_loss,
    ) -> None:
        self.runner, self.preprocess, self.parse, self.call = runner, preprocess, parse, call
        self.to_device = runner.device.type != "cpu"
        self.agree = dist.is_distributed()  # the ranks must take the same branch

    def __call__(self, data_batch: Any) -> dict:
        runner = self.runner
        model, optim_wrapper = runner.wrapped_model, runner.optim_wrapper
        loss, log_vars = self.forward(model, optim_wrapper.optim_context(model), data_batch)
        if self.rejected(loss, optim_wrapper):
            log_vars["skipped_steps"] = 1.0
            return log_vars
        optim_wrapper.update_params(loss)
        return with_grad_norm(optim_wrapper, log_vars)

    def forward(self, model: Any, context: Any, data: Any) -> tuple[torch.Tensor, dict]:
        """``data`` on the device, preprocessed and through ``model`` under ``context``; the
        losses parsed."""
        if self.to_device:
            data = move_to(data, self.runner.device)
        with context:
            if self.preprocess is not None:
                data = self.preprocess(data, True)
            losses = self.call(model, data)
        return self.parse(losses)

    def rejected(self, loss: torch.Tensor, optim_wrapper: Any) -> bool:
        """Whether a step guard rejected ``loss`` (the update is then dropped). The guards are
        asked for on every step: a failing guard with on_error='disable' leaves the set."""
        guards = self.runner.step_guards
        if guards and not guards_allow(self.runner, loss, guards, self.agree):
            optim_wrapper.skip_update()
            return True
        return False


class ElasticStep(GuardedStep):
    """One optimizer step over ``data_batch``, this rank's micro-batches of one global batch:
    each loss scaled by ``1/c`` (``c`` micro-batches), DDP's all-reduce only after the last; the
    step guards judge every micro-batch (every rank has as many, so they agree) and a rejected
    one drops the whole step; the values logged are means over the micro-batches."""

    def __call__(self, data_batch: Any) -> dict:
        runner = self.runner
        model, optim_wrapper = runner.wrapped_model, runner.optim_wrapper
        count, logged = len(data_batch), dict[str, Any]()
        weights = getattr(data_batch, "weights", None)  # an epoch's last, smaller batch's
        shares = _log_shares(weights, count)
        for i, data in enumerate(data_batch):
            last = i == count - 1
            context = optim_wrapper.micro_batch_context(model, sync=last)
            loss, log_vars = self.forward(model, context, data)
            for key, value in log_vars.items():
                logged[key] = logged.get(key, 0) + (
                    value / count if shares is None else value * shares[i]
                )
            if self.rejected(loss, optim_wrapper):
                logged["skipped_steps"] = 1.0
                return logged
            loss = loss / count if weights is None else loss * weights[i]
            if last:
                optim_wrapper.update_params(loss)
            else:  # scaled for accumulation too: a resumed run may keep accumulative_counts
                optim_wrapper.accumulate(loss)
        return with_grad_norm(optim_wrapper, logged)


def _log_shares(weights: list[float] | None, count: int) -> list[float] | None:
    """What each micro-batch counts for in the logged values: its part of this rank's samples
    (the weight-0 passes of a padded share count for nothing, unless there is nothing else)."""
    if weights is None:
        return None
    total = sum(weights)
    return [w / total for w in weights] if total > 0 else [1 / count] * count


class WithWeightedTail:
    """A run's step, and the elastic step for the epoch's last, smaller global batch on several
    ranks (weighted MicroBatches from a StreamingLoader or a re-cut DefaultSampler loader: the
    ranks' shares differ, so each loss is weighted to make the averaged gradient the batch
    mean)."""

    def __init__(self, step: StepStrategy, tail: ElasticStep) -> None:
        self.step, self.tail = step, tail

    def __call__(self, data_batch: Any) -> dict:
        if type(data_batch) is MicroBatches:
            return self.tail(data_batch)
        return self.step(data_batch)


class OwnTrainStep:
    """A model's own ``train_step(data, optim_wrapper)``, called with the batch (on the device)
    and the OptimWrapper; what it returns is logged. Under DDP (``average``) it calls its own
    module, not the DDP wrapper, so DDP cannot all-reduce the gradients: the OptimWrapper
    averages them over the ranks before each of its steps instead."""

    def __init__(self, runner: RunnerAPI, module: Any, average: bool) -> None:
        self.runner, self.module, self.average = runner, module, average
        self.to_device = runner.device.type != "cpu"

    def __call__(self, data_batch: Any) -> dict:
        runner = self.runner
        optim_wrapper = runner.optim_wrapper
        if self.to_device:
            data_batch = move_to(data_batch, runner.device)
        if self.average:
            with optim_wrapper.averaging_gradients():
                log_vars = self.module.train_step(data_batch, optim_wrapper=optim_wrapper)
        else:
            log_vars = self.module.train_step(data_batch, optim_wrapper=optim_wrapper)
        return with_grad_norm(optim_wrapper, detached(log_vars))
