"""The validation and test loops: one pass over the data with the matching mount points
(the whole run's order is in :mod:`distributed_runner.loops`' docstring)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader

from .model_steps import predictor
from .registry import LOOPS
from .step import move_to

if TYPE_CHECKING:
    from .runner_api import RunnerAPI


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
        outputs = self._predict(data_batch)  # model_steps.predictor: val_step / test_step
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
