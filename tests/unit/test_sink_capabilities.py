"""The sinks' optional capabilities (``add_image``, ``log_artifact``): ``runner.sinks`` offers an
image or a file to every open sink and counts the ones that kept it, so VisualizationHook and
MLflowCheckpointHook work with any sink that can keep them and name no sink class."""
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from distributed_runner.core.registry import DATASETS, MODELS
from distributed_runner.tracking.sinks import LogSink, MLflowSink, SinkSet, TensorBoardSink
from tests.toy import ListSink, ToyDataset, ToyModel, make_runner

IMAGE = np.zeros((4, 6, 3), dtype=np.uint8)


class KeepingSink(ListSink):
    """Keeps images and files in memory: a sink with both capabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list = []
        self.artifacts: list = []

    def add_image(self, tag: str, image: np.ndarray, step: int) -> bool:
        self.images.append((tag, image.shape, image.dtype, step))
        return True

    def log_artifact(self, path, artifact_path=None) -> bool:
        self.artifacts.append((Path(path).name, artifact_path))
        return True


class BrokenSink(ListSink):
    def log_artifact(self, path, artifact_path=None) -> bool:
        raise RuntimeError("upload failed")


def test_a_capability_reaches_the_sinks_that_have_it_and_counts_them():
    plain, keeping, other = ListSink(), KeepingSink(), KeepingSink()
    sinks = SinkSet([("a", plain), ("b", keeping), ("c", other)])
    assert sinks.add_image("val/predictions", IMAGE, 7) == 0  # not open: nothing to keep it
    assert not sinks.offers("log_artifact") and keeping.images == []
    with sinks.opened(SimpleNamespace()):
        assert sinks.offers("add_image") and sinks.offers("log_artifact")
        assert sinks.add_image("val/predictions", IMAGE, 7) == 2
        assert sinks.log_artifact(Path("/x/last.pth"), "checkpoints") == 2
    assert keeping.images == other.images == [("val/predictions", (4, 6, 3), np.uint8, 7)]
    assert keeping.artifacts == [("last.pth", "checkpoints")]
    assert plain.records == []  # skipped: LogSink's defaults keep nothing
    with pytest.raises(ValueError, match="unknown sink capability 'add_images'"):
        sinks.offers("add_images")


def test_only_sinks_without_the_capability_keep_nothing():
    sinks = SinkSet([("a", ListSink())])
    with sinks.opened(SimpleNamespace()):
        assert not sinks.offers("add_image") and not sinks.offers("log_artifact")
        assert sinks.add_image("t", IMAGE, 0) == 0
        assert sinks.log_artifact("f.png", "visualizations") == 0
    assert LogSink().add_image("t", IMAGE, 0) is False
    assert LogSink().log_artifact("f.png") is False


def test_a_failing_sink_does_not_stop_the_others_and_its_error_reaches_the_hook():
    broken, keeping = BrokenSink(), KeepingSink()
    sinks = SinkSet([("a", broken), ("b", keeping)])
    with sinks.opened(SimpleNamespace()):
        with pytest.raises(RuntimeError, match="upload failed"):
            sinks.log_artifact("last.pth", "checkpoints")
    assert keeping.artifacts == [("last.pth", "checkpoints")]


def test_built_in_sinks_say_what_they_keep(tmp_path):
    board = TensorBoardSink()
    assert board.add_image("t", IMAGE, 0) is False  # not open
    board.open(SimpleNamespace(work_dir=tmp_path, cfg={}))
    try:
        assert board.add_image("t", IMAGE, 0) is True
        assert board.log_artifact(tmp_path / "f.png") is False  # TensorBoard keeps no files
    finally:
        board.close()
    mlflow = MLflowSink()
    assert mlflow.log_artifact(tmp_path / "f.png") is False  # not open: no sender to upload
    assert mlflow.add_image("t", IMAGE, 0) is False  # images reach MLflow as files


# -- the hooks ----------------------------------------------------------------------------------
def test_mlflow_checkpoint_hook_hands_checkpoints_to_the_sink_that_keeps_files(tmp_path, runlog):
    keeping = KeepingSink()
    runner = make_runner(
        tmp_path / "keeps", train_cfg=dict(by_epoch=True, max_epochs=1),
        custom_hooks=[dict(type="MLflowCheckpointHook")],
        default_hooks=dict(logger=dict(type="LoggerHook", interval=5, sinks=["jsonl", keeping]),
                           checkpoint=dict(type="CheckpointHook", interval=1)))
    runner.train()
    hook = runner.get_hook("mlflow_checkpoint")
    assert hook.uploaded == ["epoch_1.pth"]
    assert keeping.artifacts == [("epoch_1.pth", "checkpoints")]
    runner = make_runner(tmp_path / "none", train_cfg=dict(by_epoch=True, max_epochs=1),
                         custom_hooks=[dict(type="MLflowCheckpointHook")])
    runner.train()  # jsonl only: nothing keeps files
    assert runner.get_hook("mlflow_checkpoint").uploaded == []
    assert ("MLflowCheckpointHook needs a sink that keeps artifacts — an 'mlflow' sink "
            "(default_hooks.logger.sinks) — and default_hooks.checkpoint: nothing uploaded"
            ) in runlog.text


@DATASETS.register_module(force=True)
class CapabilityImages(ToyDataset):
    """ToyDataset's samples as 2 x 2 single-channel images."""

    def __getitem__(self, i: int) -> dict:
        item = super().__getitem__(i)
        return {**item, "inputs": item["inputs"].view(1, 2, 2)}


@MODELS.register_module(force=True)
class CapabilityImageModel(ToyModel):
    def forward(self, inputs: torch.Tensor, labels=None, index=None, mode="predict"):
        return super().forward(inputs.flatten(1), labels, index, mode)


def test_visualization_hook_offers_its_grid_as_image_and_file(tmp_path):
    keeping = KeepingSink()
    data = dict(dataset=dict(type="CapabilityImages", n=8, seed=1), batch_size=4,
                sampler=dict(type="DefaultSampler", shuffle=False))
    runner = make_runner(
        tmp_path, model=dict(type="CapabilityImageModel"), val_dataloader=data,
        train_dataloader={**data, "dataset": dict(type="CapabilityImages", n=8)},
        train_cfg=dict(by_epoch=True, max_epochs=1),
        custom_hooks=[dict(type="VisualizationHook", max_images=4)],
        default_hooks=dict(logger=dict(type="LoggerHook", interval=1, sinks=[keeping])))
    runner.train()
    (tag, shape, dtype, step), = keeping.images
    assert (tag, len(shape), shape[2], dtype, step) == ("val/predictions", 3, 3, np.uint8, 2)
    assert keeping.artifacts == [("val_iter_2.png", "visualizations")]
