"""How the loops call a model written MMEngine's way: its own ``train_step(data, optim_wrapper)``,
``val_step(data)``, ``test_step(data)`` and ``data_preprocessor`` are honoured.

A plain model (DESIGN §5: ``forward(**batch, mode=...)``) takes none of these paths: the loops ask
:func:`model_steps` once per run and keep their short path when it answers None.

* **A ``data_preprocessor``** (a callable attribute, MMEngine's ``BaseDataPreprocessor`` or
  ours) gets each batch first, with ``training`` True in training steps and False in evaluation;
  the Runner then calls the wrapped model (DDP/FSDP/compiled) with what it returns, and the
  model's ``parse_losses`` if it has one.
* **An overridden ``train_step``** is called with the batch (moved to the device) and the
  OptimWrapper, and its returned dict is the iteration's ``outputs``. Under DDP the model calls
  its own module, not the DDP wrapper, so DDP cannot synchronise the gradients: the Runner
  averages them over the ranks before every optimizer step instead (one all-reduce per step,
  after backward, not overlapped with it). MMEngine's ``MMDistributedDataParallel`` ignores such
  an override; here it runs. Step guards (NonFiniteLossHook) need the loss before backward,
  which such a train_step does not hand out: the two together are a config error.
* **An overridden ``val_step`` / ``test_step``** is called for each evaluation batch and its
  result goes to the evaluator — except under PrepareTTAHook, whose wrapper calls ``forward``
  for each view (after the preprocessor), where MMEngine's calls ``test_step`` per view.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

from . import dist
from .errors import ConfigError
from .model_setup import get_ori_model, wrapper_layers
from .step import call_model, forward_and_update, move_to, parse_losses, with_grad_norm


def _overrides(module: Any, name: str) -> bool:
    """Whether ``module``'s class defines step ``name`` itself (BaseModel's default does what
    the Runner does, through the wrapper, so it does not count)."""
    from .model import BaseModel
    method = getattr(type(module), name, None)
    return callable(method) and method is not getattr(BaseModel, name, None)


def _preprocessor(module: Any) -> Callable | None:
    pre = getattr(module, "data_preprocessor", None)
    return pre if callable(pre) else None


def _detached(log_vars: Any) -> dict:
    if not isinstance(log_vars, dict):
        raise TypeError(f"train_step must return a dict of values to log, got "
                        f"{type(log_vars).__name__}")
    return {k: v.detach() if torch.is_tensor(v) else v for k, v in log_vars.items()}


class ModelSteps:
    """The training step of a model with a data_preprocessor or its own train_step."""

    def __init__(self, runner: Any, module: Any) -> None:
        self.runner, self.module = runner, module
        self.preprocess = _preprocessor(module)
        self.own_train_step = _overrides(module, "train_step")
        parse = getattr(module, "parse_losses", None)
        self.parse_losses = parse if callable(parse) else parse_losses
        guards = runner.step_guards
        if self.own_train_step and guards:
            names = ", ".join(type(g).__name__ for g in guards)
            raise ConfigError("custom_hooks", f"{names} checks the loss between forward and "
                              f"backward, but {type(module).__name__}.train_step does both in "
                              f"one call: remove the hook, or let the Runner run the step "
                              f"(drop the train_step override)")

    def train_step(self, data_batch: Any, step_allowed: Callable) -> dict:
        runner = self.runner
        model, optim_wrapper = runner.wrapped_model, runner.optim_wrapper
        if runner.device.type != "cpu":
            data_batch = move_to(data_batch, runner.device)
        if self.own_train_step:
            with self._gradients_averaged(model, optim_wrapper):
                log_vars = self.module.train_step(data_batch, optim_wrapper=optim_wrapper)
            return with_grad_norm(optim_wrapper, _detached(log_vars))
        return forward_and_update(runner, data_batch, step_allowed, self.preprocess,
                                  self._parse)

    def _parse(self, losses: Any) -> tuple[torch.Tensor, dict]:
        loss, log_vars = self.parse_losses(losses)
        return loss, _detached(log_vars)

    @contextlib.contextmanager
    def _gradients_averaged(self, model: Any, optim_wrapper: Any) -> Iterator[None]:
        """Under DDP, the OptimWrapper averages the gradients over ranks before it steps."""
        from torch.nn.parallel import DistributedDataParallel
        if not (isinstance(model, DistributedDataParallel) and dist.is_distributed()):
            yield
            return
        plain, optim_wrapper.plain_step = optim_wrapper.plain_step, False
        optim_wrapper.grad_sync = lambda: average_gradients(optim_wrapper.optimizer)
        try:
            yield
        finally:
            optim_wrapper.plain_step, optim_wrapper.grad_sync = plain, None


def average_gradients(optimizer: torch.optim.Optimizer) -> None:
    """Every gradient of ``optimizer``'s parameters replaced by its mean over the ranks: one
    all-reduce per dtype and device, over the gradients flattened together."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    for grads in groups.values():
        flat = dist.all_reduce(torch.cat([g.reshape(-1) for g in grads]), "mean")
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))


def _under_tta(model: Any) -> bool:
    """Whether PrepareTTAHook's wrapper is among ``model``'s wrappers (its views call the
    model's forward, so an own test_step would bypass them)."""
    from .tta import TTAModel
    return any(isinstance(layer, TTAModel) for layer in wrapper_layers(model))


def model_steps(runner: Any) -> ModelSteps | None:
    """The training step for the runner's model, or None for a plain model (the loop's own)."""
    module = get_ori_model(runner.wrapped_model)
    if _preprocessor(module) is None and not _overrides(module, "train_step"):
        return None
    if getattr(runner, "elastic_plan", None) is not None:
        raise ConfigError("launcher.num_workers", f"an elastic range splits each global batch "
                          f"into micro-batches and calls forward itself, so "
                          f"{type(module).__name__}'s data_preprocessor / train_step would not "
                          f"run: use a fixed number of workers")
    return ModelSteps(runner, module)


def predictor(runner: Any, stage: str) -> Callable[[Any], Any]:
    """What an evaluation loop calls with each batch, already on the device (``stage``: 'val' or
    'test'): the model's own ``val_step`` / ``test_step``, else its preprocessor (if any) then
    the wrapped model's ``forward(mode='predict')``."""
    model = runner.wrapped_model
    module = get_ori_model(model)
    if _overrides(module, f"{stage}_step") and not _under_tta(model):
        return getattr(module, f"{stage}_step")
    pre = _preprocessor(module)
    if pre is not None:
        return lambda data: call_model(model, pre(data, False), "predict")
    return lambda data: call_model(model, data, "predict")
