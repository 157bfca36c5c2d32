"""NaiveVisualizationHook: the seeds' name for drawing test predictions, with MMEngine's
arguments (``interval``, ``draw_gt``, ``draw_pred``) and defaults."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import DataBatch
from hooks.visualization_hook import VisualizationHook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class NaiveVisualizationHook(VisualizationHook):
    """ "Show or write the predicted results during the process of testing" (seed 000).

    As MMEngine's: it draws during ``Runner.test()`` only, from every ``interval``-th test batch
    (``interval=2``: batches 2, 4, ...), with the true label (``draw_gt``) and the prediction
    (``draw_pred``), at priority NORMAL. Where it draws to, and the other arguments
    (``max_images``, ``image_key``, ``label_key``, ``scale``, ``out_dir``, ``stages``), are
    VisualizationHook's: the grid is written to ``work_dir/vis/test_iter_<N>.png``, TensorBoard
    and MLflow. MMEngine's hook needs an OpenMMLab visualizer and data samples; this one draws
    the image and label tensors of a plain batch.
    """

    priority = "NORMAL"

    def __init__(
        self,
        interval: int = 1,
        draw_gt: bool = True,
        draw_pred: bool = True,
        max_images: int = 16,
        stages: Sequence[str] = ("test",),
        **kwargs: Any,
    ) -> None:
        super().__init__(
            interval=interval,
            max_images=max_images,
            stages=stages,
            draw_gt=draw_gt,
            draw_pred=draw_pred,
            **kwargs,
        )

    def _begin(self, runner: RunnerAPI, stage: str) -> None:
        super()._begin(runner, stage)
        if stage == "val":  # every validation (interval counts batches here, not evaluations)
            self._active = runner.rank == 0 and "val" in self.stages

    def _every_nth_batch(
        self, batch_idx: int, data_batch: DataBatch, outputs: Sequence | None
    ) -> None:
        if (batch_idx + 1) % self.interval == 0:
            self._collect(data_batch, outputs)

    def after_val_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: Sequence | None = None,
    ) -> None:
        self._every_nth_batch(batch_idx, data_batch, outputs)

    def after_test_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: Sequence | None = None,
    ) -> None:
        self._every_nth_batch(batch_idx, data_batch, outputs)
