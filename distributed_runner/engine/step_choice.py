"""Which steps the loops run for this run's model: :func:`choose_step` for training (one of
step.py's strategies, chosen once per run) and :func:`predictor` for evaluation.

A plain model (``forward(**batch, mode=...)``, batches passed as model/calling.py says) with a plain
OptimWrapper and no step guards trains with the plain step, the cheapest; step guards, clipping,
accumulation, AMP or a subclassed OptimWrapper take the general (guarded) step.

**A model as it is** (:func:`takes_mode` is False: its ``forward`` has no ``mode`` parameter and
it is no BaseModel, ours or MMEngine's; a Hugging Face or timm model) is called without ``mode``
(``forward(**batch)``); the loss is what model/calling.py's ``LossOf`` finds in what it returns, and
in evaluation the predictions are the returned tensor or the returned ``logits``
(:func:`predictions`). The convention is decided once per run, here, and handed to the steps as a
``call``/``parse`` pair. A model written MMEngine's way is honoured:

* **A ``data_preprocessor``** (a callable attribute, MMEngine's ``BaseDataPreprocessor`` or
  ours) gets each batch first, with ``training`` True in training steps and False in evaluation;
  the Runner then calls the wrapped model (DDP/FSDP/compiled) with what it returns, and the
  model's ``parse_losses`` if it has one.
* **An overridden ``train_step``** is called with the batch (moved to the device) and the
  OptimWrapper, and its returned dict is the iteration's ``outputs``. Under DDP the model calls
  its own module, not the DDP wrapper, so DDP cannot synchronise the gradients: the OptimWrapper
  averages them over the ranks before every optimizer step instead (one all-reduce per step,
  after backward, not overlapped with it). MMEngine's ``MMDistributedDataParallel`` ignores such
  an override; here it runs. Step guards (NonFiniteLossHook) need the loss before backward,
  which such a train_step does not hand out: the two together are a config error.
* **An overridden ``val_step`` / ``test_step``** is called for each evaluation batch and its
  result goes to the evaluator — except under PrepareTTAHook, whose wrapper calls ``forward``
  for each view (after the preprocessor), where MMEngine's calls ``test_step`` per view.

An elastic run (``launcher.num_workers=(min, max)``), or one resumed at another world size
(data/world_change.py), trains with the elastic step, which runs the data_preprocessor and
``forward`` for each micro-batch of a global batch: an own train_step (one batch per call) is
refused.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parallel import DistributedDataParallel

from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError
from distributed_runner.engine.pipeline_step import (
    PipelinePredictor,
    PipelineStep,
    refuse_own_train_step,
)
from distributed_runner.engine.replica_step import ReplicaStep
from distributed_runner.engine.step import (
    ElasticStep,
    GuardedStep,
    OwnTrainStep,
    PlainStep,
    StepStrategy,
    WithWeightedTail,
    detaching,
)
from distributed_runner.model.base import BaseModel
from distributed_runner.model.build import get_ori_model, wrapper_layers
from distributed_runner.model.calling import (
    LossOf,
    call_as_is,
    call_for_loss,
    call_model,
    parse_losses,
)

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


def _overrides(module: Any, name: str) -> bool:
    """Whether ``module``'s class defines step ``name`` itself (BaseModel's default does what
    the Runner does, through the wrapper, so it does not count)."""
    method = getattr(type(module), name, None)
    return callable(method) and method is not getattr(BaseModel, name, None)


def trains_itself(model: Any) -> bool:
    """Whether ``model`` (wrapped or not) has its own ``train_step``: one batch per call, which
    the Runner cannot split into weighted micro-batches (data/elastic.py's exact_epochs)."""
    return _overrides(get_ori_model(model), "train_step")


def _preprocessor(module: Any) -> Callable | None:
    pre = getattr(module, "data_preprocessor", None)
    return pre if callable(pre) else None


def takes_mode(module: Any) -> bool:
    """Whether ``module`` is written MMEngine's way: a BaseModel (ours or MMEngine's), or a
    ``forward`` with an explicit ``mode`` parameter (``**kwargs`` does not count: Hugging Face
    forwards take them and would choke on ``mode``)."""
    if isinstance(module, BaseModel) or any(
        c.__name__ == "BaseModel" and c.__module__.startswith("mmengine")
        for c in type(module).__mro__
    ):
        return True
    try:
        params = inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):  # no signature to read: the long-standing convention
        return True
    return "mode" in params and params["mode"].kind is not inspect.Parameter.VAR_POSITIONAL


def _as_is(module: Any) -> tuple[Callable, Callable] | None:
    """The ``call``/``parse`` pair for a model taken as it is; None for MMEngine's convention."""
    if takes_mode(module):
        return None
    return call_as_is, LossOf(type(module).__name__)


def _own_parse(module: Any, as_is: Any, parse: Callable) -> Callable:
    """An MMEngine model's own ``parse_losses``, if it has one, else ``parse``."""
    own_parse = getattr(module, "parse_losses", None)
    return own_parse if as_is is None and callable(own_parse) else parse


def _no_own_step(plan: Any, model: str) -> tuple[str, str]:
    """Why a run that trains global batches as micro-batches refuses a model's own train_step
    (it trains one batch per call, forward and backward together)."""
    if plan.kept_from is not None:  # data/world_change.py
        return "resume", (
            f"the checkpoint was trained on {plan.kept_from} data-parallel ranks and this run "
            f"keeps its global batch as micro-batches, which {model}.train_step cannot take: "
            f"resume on {plan.kept_from} ranks"
        )
    return "launcher.num_workers", (
        f"an elastic range splits each global batch into micro-batches and calls forward "
        f"itself, so {model}.train_step would not run: use a fixed number of workers"
    )


def choose_step(runner: RunnerAPI) -> StepStrategy:
    """The training step of this run (step.py), chosen once when training starts, after
    ``before_train``; see the module docstring for which one."""
    module = get_ori_model(runner.wrapped_model)
    preprocess, own_train_step = _preprocessor(module), _overrides(module, "train_step")
    as_is = _as_is(module)
    call, parse = as_is or (call_for_loss, parse_losses)
    if preprocess is not None:
        parse = detaching(_own_parse(module, as_is, parse))
    if getattr(runner, "replicas", None) is not None:  # fault_tolerance: replica_step.py
        if own_train_step:
            raise ConfigError(
                "fault_tolerance",
                f"{type(module).__name__}.train_step steps the optimizer itself, so a replica "
                f"cannot train a missing replica's share with it: drop the override",
            )
        return ReplicaStep(runner, preprocess, parse, call)
    if getattr(runner, "pipeline", None) is not None:  # strategy.pp: pipeline_step.py
        refuse_own_train_step(type(module).__name__, own_train_step)
        return PipelineStep(runner)
    plan = getattr(runner, "elastic_plan", None)
    if plan is not None:
        if own_train_step:
            raise ConfigError(*_no_own_step(plan, type(module).__name__))
        return ElasticStep(runner, preprocess, parse, call)
    if own_train_step:
        step: StepStrategy = _own_train_step(runner, module)
    elif preprocess is not None or runner.step_guards or not runner.optim_wrapper.is_plain():
        step = GuardedStep(runner, preprocess, parse, call)
    else:
        step = PlainStep(runner) if as_is is None else PlainStep(runner, call, parse)
    if not getattr(runner.train_dataloader, "weighted_tail", False):
        return step
    if own_train_step:
        raise ConfigError(
            "train_dataloader.drop_last",
            f"{type(module).__name__}.train_step trains one batch per call, so the epoch's "
            f"last, smaller global batch cannot be weighted over the ranks' unequal shares: "
            f"set drop_last=True",
        )
    return WithWeightedTail(step, ElasticStep(runner, preprocess, parse, call))


def _own_train_step(runner: RunnerAPI, module: Any) -> OwnTrainStep:
    guards = runner.step_guards
    if guards:
        names = ", ".join(type(g).__name__ for g in guards)
        raise ConfigError(
            "custom_hooks",
            f"{names} checks the loss between forward and "
            f"backward, but {type(module).__name__}.train_step does both in "
            f"one call: remove the hook, or let the Runner run the step "
            f"(drop the train_step override)",
        )
    average = isinstance(runner.wrapped_model, DistributedDataParallel) and dist.is_distributed()
    return OwnTrainStep(runner, module, average)


def _under_tta(model: Any) -> bool:
    """Whether PrepareTTAHook's wrapper is among ``model``'s wrappers (its views call the
    model's forward, so an own test_step would bypass them)."""
    from distributed_runner.model.tta import TTAModel

    return any(isinstance(layer, TTAModel) for layer in wrapper_layers(model))


def predictor(runner: RunnerAPI, stage: str) -> Callable[[Any], Any]:
    """What an evaluation loop calls with each batch, already on the device (``stage``: 'val' or
    'test'): the model's own ``val_step`` / ``test_step``, else its preprocessor (if any) then
    the wrapped model's ``forward(mode='predict')`` — for a model taken as it is, its
    ``forward(**batch)`` and :func:`predictions` of what it returns."""
    if getattr(runner, "pipeline", None) is not None:  # the stages' forward-only schedule
        return PipelinePredictor(runner)
    model = runner.wrapped_model
    module = get_ori_model(model)
    if _overrides(module, f"{stage}_step") and not _under_tta(model):
        return getattr(module, f"{stage}_step")
    pre = _preprocessor(module)
    if not takes_mode(module):
        if pre is not None:
            return lambda data: predictions(call_as_is(model, pre(data, False)))
        return lambda data: predictions(call_as_is(model, data))
    if pre is not None:
        return lambda data: call_model(model, pre(data, False), "predict")
    return lambda data: call_model(model, data, "predict")


def predictions(outputs: Any) -> Any:
    """What the metrics get from a model taken as it is: a returned tensor, else the returned
    ``logits`` (a mapping's entry or an attribute: Hugging Face's ``ModelOutput``), else the
    outputs unchanged."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, Mapping) and "logits" in outputs:
        return outputs["logits"]
    logits = getattr(outputs, "logits", None)
    return outputs if logits is None else logits
