"""PrepareTTAHook: test with test-time augmentation."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distributed_runner.core.errors import ArgumentError, argument_errors
from distributed_runner.core.registry import HOOKS, MODELS
from distributed_runner.core.signatures import check_arguments
from distributed_runner.engine.hook import Hook
from distributed_runner.model.tta import TTAModel

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class PrepareTTAHook(Hook):
    """Wrap the model the test loop calls in a TTA model at ``before_test`` and unwrap it at
    ``after_test`` (also when testing failed): ``tta_cfg=dict(type='TTAModel',
    transforms=['Identity', dict(type='Flip', dims=[-1])], merge='softmax_mean')``. Any
    registered model taking ``module`` works as ``type``. Validation and training are untouched.
    Ranks: every rank wraps its own model.
    """

    priority = "NORMAL"

    def __init__(self, tta_cfg: dict | None = None) -> None:
        self.tta_cfg = dict(tta_cfg or {"type": "TTAModel"})
        self.tta_cfg.setdefault("type", "TTAModel")
        with argument_errors():
            cls = MODELS.resolve(self.tta_cfg["type"], "tta_cfg")
            check_arguments(
                cls,
                {k: v for k, v in self.tta_cfg.items() if k != "type"},
                "tta_cfg",
                supplied=["module"],
            )
        self._original: Any = None

    def before_test(self, runner: RunnerAPI) -> None:
        self._original = runner.wrapped_model
        with argument_errors():
            wrapped = MODELS.build({**self.tta_cfg, "module": self._original}, "tta_cfg")
        if not callable(wrapped):
            raise ArgumentError("tta_cfg", "did not build a model")
        runner.wrapped_model = wrapped
        if isinstance(wrapped, TTAModel):
            runner.logger.info(
                "testing with %d augmented views merged by %s",
                len(wrapped.transforms),
                wrapped.merge,
            )

    def after_test(self, runner: RunnerAPI) -> None:
        if self._original is not None:
            runner.wrapped_model = self._original
            self._original = None
