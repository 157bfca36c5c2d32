"""The step under pipeline parallelism (``strategy.pp``, distributed_runner/parallel/pipeline.py).

Every rank of the pipeline reads the same batch; torch's schedule owns forward and backward::

    first stage:  schedule.step(input_ids)            # cut into pp_microbatches
    last stage:   schedule.step(target=labels, losses=losses)   # the loss is the model's own
    other stages: schedule.step()
    loss = the mean of the micro-batches' losses, sent from the last stage to every rank
    optimizer step: gradients clipped by the norm over every stage (parallel/grad_norm.py)

So every hook that reads the step's outputs (the logger, early stopping, the throughput meter)
sees the same values on every rank, as with one process. The schedule scales each micro-batch's
gradient by ``1 / pp_microbatches``: with equal micro-batches the update is one process's.
Validation and the test loop run the same schedule forward only (:class:`PipelinePredictor`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from distributed_runner.core.errors import ConfigError
from distributed_runner.engine.step import with_grad_norm
from distributed_runner.model.calling import move_to
from distributed_runner.parallel.pipeline import microbatches

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


class PipelineStep:
    """The step of the module docstring (``runner.pipeline``: this rank's PipelineParts)."""

    def __init__(self, runner: RunnerAPI) -> None:
        refuse_step_guards(runner.step_guards)
        self.runner, self.parts = runner, runner.pipeline
        self.microbatches = microbatches(runner.strategy)

    def __call__(self, data_batch: Any) -> dict:
        runner = self.runner
        inputs, labels = _inputs_and_labels(move_to(data_batch, runner.device))
        if len(inputs) % self.microbatches:
            raise ConfigError(
                "train_dataloader.batch_size",
                f"a batch of {len(inputs)} does not split into strategy.pp_microbatches="
                f"{self.microbatches} equal micro-batches: make every batch a multiple of it "
                f"(drop_last=True for a dataset whose length is not)",
            )
        losses: list[torch.Tensor] = []
        parts = self.parts
        parts.run(runner.model, runner.strategy, runner.device, (inputs, labels, losses), True)
        loss = torch.stack(losses).mean().detach() if losses else torch.zeros(())
        loss = loss.to(runner.device)
        torch.distributed.broadcast(loss, group=parts.group, group_src=parts.last_rank)
        optim_wrapper = runner.optim_wrapper
        optim_wrapper.step()
        optim_wrapper.zero_grad()
        return with_grad_norm(optim_wrapper, {"loss": loss})


def refuse_step_guards(guards: tuple) -> None:
    """Step guards under ``strategy.pp``, one line (the Ray driver asks of the planned hooks,
    the step again of the built ones)."""
    if guards:
        raise ConfigError(
            "custom_hooks",
            f"{type(guards[0]).__name__} is a step guard: it needs the loss before backward, "
            f"which the pipeline's schedule computes inside it: remove it from a strategy.pp run",
        )


def refuse_own_train_step(model_name: str, own_train_step: bool) -> None:
    """A model's own ``train_step`` under ``strategy.pp``, one line (the Ray driver asks of the
    model built on the meta device, the step again)."""
    if own_train_step:
        raise ConfigError(
            "strategy.pp",
            f"{model_name}.train_step runs forward and backward itself, but under pipeline "
            f"parallelism the schedule does: drop the override",
        )


def _inputs_and_labels(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """A causal LM's batch: ``input_ids`` and ``labels`` (no padding mask: the stages build the
    causal mask themselves)."""
    if not isinstance(batch, dict) or "input_ids" not in batch or "labels" not in batch:
        raise ConfigError(
            "train_dataloader",
            "a strategy.pp run trains a causal LM on dict batches of input_ids and labels",
        )
    extra = sorted(set(batch) - {"input_ids", "labels"})
    if extra:
        raise ConfigError(
            "train_dataloader",
            f"the batch has {extra[0]!r}, which a pipeline stage does not take yet (input_ids "
            f"and labels only: sequences of one length, no padding mask)",
        )
    return batch["input_ids"], batch["labels"]


class PipelinePredictor:
    """What validation and ``drun test`` call with each batch under pipeline parallelism:
    torch's forward-only schedule over the stages, and the last stage's logits sent to every
    rank of the pipeline (the evaluator counts one rank of each: core/dist.py)."""

    def __init__(self, runner: RunnerAPI) -> None:
        self.runner, self.parts = runner, runner.pipeline
        self.microbatches = microbatches(runner.strategy)

    def __call__(self, data: Any) -> torch.Tensor:
        inputs, labels = _inputs_and_labels(data)
        count = len(inputs)
        pad = -count % self.microbatches  # a last, smaller batch: its last sample repeated
        if pad:
            inputs, labels = (
                torch.cat([t, t[-1:].expand(pad, *t.shape[1:])]) for t in (inputs, labels)
            )
        runner = self.runner
        outputs = self.parts.run(
            runner.model, runner.strategy, runner.device, (inputs, labels), False
        )
        return self.parts.share_outputs(outputs if self.parts.last else None)[:count]
