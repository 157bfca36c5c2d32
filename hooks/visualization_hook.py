"""VisualizationHook: a grid of input images with predicted and true labels, per evaluation."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import DataBatch, Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


def _field(batch: Any, key: str, index: int) -> Any:
    if isinstance(batch, dict):
        return batch.get(key)
    if isinstance(batch, (list, tuple)) and len(batch) > index:
        return batch[index]
    return None


def _tile(image: torch.Tensor, scale: int) -> np.ndarray:
    """``C x H x W`` or ``H x W`` -> ``H*scale x W*scale x 3`` uint8, min-max normalised."""
    img = image.detach().float().cpu()
    if img.dim() == 2:
        img = img[None]
    img = img[:3] if img.shape[0] >= 3 else img[:1].expand(3, -1, -1)
    lo, hi = img.min(), img.max()
    img = (img - lo) / (hi - lo) if hi > lo else torch.zeros_like(img)
    arr = (img.permute(1, 2, 0).numpy() * 255).astype(np.uint8)
    return arr.repeat(scale, 0).repeat(scale, 1)


@HOOKS.register_module()
class VisualizationHook(Hook):
    """After every ``interval``-th validation (and every test), draw the first ``max_images``
    samples — the image (``image_key`` of a dict batch / ``image_index`` of a tuple batch),
    ``p:<predicted>`` and ``t:<true label>`` (``label_key``/``label_index``) in green when right,
    red when wrong — as one grid, and write it

    * as an image ``<stage>/predictions`` to every sink of ``runner.sinks`` that keeps images
      (a ``tensorboard`` sink),
    * as the file ``visualizations/<stage>_iter_<N>.png`` to every sink that keeps files (an
      ``mlflow`` sink),
    * to ``work_dir/<out_dir>/<stage>_iter_<N>.png`` always.

    Predictions are the ``argmax`` of the model's outputs (logits/scores ``N x K``) or the
    outputs themselves when they are integer labels. Images are ``N x C x H x W`` or
    ``N x H x W``, upscaled by ``scale``. ``draw_gt=False`` / ``draw_pred=False`` leave out the
    true / predicted label (MMEngine's names). The seeds' NaiveVisualizationHook (a subclass
    with MMEngine's defaults) draws test batches.
    ``on_error='warn'``: a drawing problem never stops training. Ranks: rank 0 draws its own
    shard's first samples.
    """

    priority = "LOW"
    on_error = "warn"

    def __init__(
        self,
        interval: int = 1,
        max_images: int = 16,
        image_key: str = "inputs",
        label_key: str = "labels",
        image_index: int = 0,
        label_index: int = 1,
        scale: int = 4,
        out_dir: str = "vis",
        stages: Sequence[str] = ("val", "test"),
        draw_gt: bool = True,
        draw_pred: bool = True,
    ) -> None:
        if int(interval) < 1 or int(max_images) < 1 or int(scale) < 1:
            raise ArgumentError("", "interval, max_images and scale must be >= 1")
        unknown = set(stages) - {"val", "test"}
        if unknown:
            raise ArgumentError(
                "stages", f"unknown stage {sorted(unknown)[0]!r}: use 'val' and/or 'test'"
            )
        self.interval, self.max_images, self.scale = int(interval), int(max_images), int(scale)
        self.image_key, self.label_key = image_key, label_key
        self.image_index, self.label_index = int(image_index), int(label_index)
        self.out_dir, self.stages = out_dir, tuple(stages)
        self.draw_gt, self.draw_pred = bool(draw_gt), bool(draw_pred)
        self.written: list[Path] = []
        self._samples: list[tuple[torch.Tensor, int, int | None]] = []
        self._active = False
        self._evaluations = 0

    # -- collecting ----------------------------------------------------------------------------
    def _begin(self, runner: RunnerAPI, stage: str) -> None:
        self._samples = []
        self._active = runner.rank == 0 and stage in self.stages
        if stage == "val":
            self._evaluations += 1
            self._active = self._active and self._evaluations % self.interval == 0

    def _collect(self, data_batch: DataBatch, outputs: Any) -> None:
        if not self._active or len(self._samples) >= self.max_images:
            return
        images = _field(data_batch, self.image_key, self.image_index)
        labels = _field(data_batch, self.label_key, self.label_index)
        if not torch.is_tensor(images) or images.dim() not in (3, 4):
            raise ValueError(
                "inputs are not images (N x C x H x W or N x H x W): set this "
                "hook's image_key / image_index"
            )
        preds = outputs if torch.is_tensor(outputs) else torch.as_tensor(outputs)
        preds = preds.argmax(-1) if preds.is_floating_point() else preds
        for i in range(min(len(images), self.max_images - len(self._samples))):
            label = int(labels[i]) if torch.is_tensor(labels) else None
            self._samples.append((images[i].detach().cpu(), int(preds[i]), label))

    def before_val_epoch(self, runner: RunnerAPI) -> None:
        self._begin(runner, "val")

    def before_test_epoch(self, runner: RunnerAPI) -> None:
        self._begin(runner, "test")

    def after_val_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: Sequence | None = None,
    ) -> None:
        self._collect(data_batch, outputs)

    def after_test_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: Sequence | None = None,
    ) -> None:
        self._collect(data_batch, outputs)

    def after_val_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        self._publish(runner, "val")

    def after_test_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        self._publish(runner, "test")

    # -- drawing and writing -------------------------------------------------------------------
    def draw(self) -> np.ndarray:
        """The grid of the collected samples as ``H x W x 3`` uint8."""
        from PIL import Image, ImageDraw

        tiles = [_tile(img, self.scale) for img, _, _ in self._samples]
        h = max(t.shape[0] for t in tiles)
        w = max(48, *(t.shape[1] for t in tiles))
        cols = min(len(tiles), 8)
        rows = -(-len(tiles) // cols)
        caption = 12
        canvas = Image.new("RGB", (cols * (w + 2), rows * (h + caption + 2)), "white")
        pen = ImageDraw.Draw(canvas)
        for n, (tile, (_, pred, label)) in enumerate(zip(tiles, self._samples, strict=True)):
            x, y = (n % cols) * (w + 2), (n // cols) * (h + caption + 2)
            canvas.paste(Image.fromarray(tile), (x, y))
            shown = ([f"p:{pred}"] if self.draw_pred else []) + (
                [f"t:{label}"] if self.draw_gt and label is not None else []
            )
            text = " ".join(shown)
            color = (0, 140, 0) if label is None or label == pred else (200, 0, 0)
            pen.text((x + 1, y + h), text, fill=color)
        return np.asarray(canvas)

    def _publish(self, runner: RunnerAPI, stage: str) -> None:
        if not self._active or not self._samples:
            return
        self._active = False
        from PIL import Image

        grid = self.draw()
        path = Path(runner.work_dir) / self.out_dir / f"{stage}_iter_{runner.iter}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(grid).save(path)
        self.written.append(path)
        # offered to every sink: the ones that keep images (tensorboard) or files (mlflow) do
        runner.sinks.add_image(f"{stage}/predictions", grid, runner.iter)
        runner.sinks.log_artifact(path, "visualizations")
