"""MMEngine's smaller hooks under their MMEngine names and arguments: NaiveVisualizationHook
(``interval``, ``draw_gt``, ``draw_pred``), NPUProfilerHook (built when ``torch_npu`` imports,
a one-line error otherwise), and ProfilerHook's ``on_trace_ready`` keys passed through."""
import sys
import types

import numpy as np
import pytest

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import DATASETS, MODELS
from tests.toy import ToyDataset, ToyModel, make_runner


@DATASETS.register_module(force=True)
class ToyImages(ToyDataset):
    """ToyDataset's samples as 2 x 2 single-channel images."""

    def __getitem__(self, i: int) -> dict:
        item = super().__getitem__(i)
        return {**item, "inputs": item["inputs"].view(1, 2, 2)}


@MODELS.register_module(force=True)
class ToyImageModel(ToyModel):
    def forward(self, inputs, labels=None, index=None, mode="predict"):
        return super().forward(inputs.flatten(1), labels, index, mode)


def image_runner(tmp_path, hook: dict):
    data = dict(dataset=dict(type="ToyImages", n=20, seed=1), batch_size=4,
                sampler=dict(type="DefaultSampler", shuffle=False))
    return make_runner(tmp_path, model=dict(type="ToyImageModel"),
                       train_dataloader={**data, "dataset": dict(type="ToyImages", n=40)},
                       val_dataloader=data, test_dataloader=data,
                       test_evaluator=dict(type="Accuracy"), test_cfg=dict(),
                       train_cfg=dict(by_epoch=True, max_epochs=1), custom_hooks=[hook])


def test_naive_visualization_hook_draws_every_nth_test_batch_with_mmengines_arguments(tmp_path):
    from PIL import Image

    grids = {}
    for name, hook in {"every_2nd": dict(interval=2), "every": dict(interval=1),
                       "no_labels": dict(interval=2, draw_gt=False, draw_pred=False)}.items():
        runner = image_runner(tmp_path / name, dict(type="NaiveVisualizationHook", **hook))
        runner.train()  # as in MMEngine, nothing is drawn while training and validating
        visualizer = runner.get_hook("naive_visualization")
        assert visualizer.written == [] and visualizer.priority == 50  # NORMAL
        runner.test()
        assert [p.name for p in visualizer.written] == [f"test_iter_{runner.iter}.png"]
        grids[name] = np.asarray(Image.open(visualizer.written[0]))
        # 5 test batches of 4: interval=2 draws batches 2 and 4 (8 images, one row of 8)
        assert len(visualizer._samples) == {"every": 16}.get(name, 8)
    row = grids["every_2nd"].shape[0]
    assert grids["every"].shape[0] == 2 * row  # 16 images: two rows
    tile = 2 * 4  # 2 x 2 pixels, scale 4
    same_images = grids["every_2nd"][:tile], grids["no_labels"][:tile]
    assert np.array_equal(*same_images)
    captions = grids["every_2nd"][tile:row], grids["no_labels"][tile:row]
    assert not np.array_equal(*captions) and (captions[1] == 255).all()  # no text at all


def test_npu_profiler_hook_needs_torch_npu_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # not importable, as on this machine
    with pytest.raises(ConfigError, match=r"^custom_hooks\[0\]: NPUProfilerHook needs the "
                                          r"torch_npu package \(Ascend NPUs; pip install "
                                          r"torch-npu\), which cannot be imported here$"):
        make_runner(tmp_path, custom_hooks=[dict(type="NPUProfilerHook")])


class _NpuProfile:
    """What the hook calls on ``torch_npu.npu.profile`` (no Ascend device exists here):
    records when it is entered and left."""
    events: list = []

    def __init__(self, path, use_e2e_profiler=False):
        self.events.append(("profile", path, use_e2e_profiler))

    def __enter__(self):
        self.events.append("enter")

    def __exit__(self, *exc):
        self.events.append("exit")


def test_npu_profiler_hook_profiles_begin_to_end_and_stops_training(tmp_path, monkeypatch):
    npu = types.ModuleType("torch_npu")
    npu.npu = types.SimpleNamespace(profile=_NpuProfile)
    monkeypatch.setitem(sys.modules, "torch_npu", npu)
    _NpuProfile.events = []
    with pytest.raises(ConfigError, match=r"custom_hooks\[0\].end: must be greater than begin"):
        make_runner(tmp_path, custom_hooks=[dict(type="NPUProfilerHook", begin=3, end=3)])
    runner = make_runner(tmp_path, custom_hooks=[dict(type="NPUProfilerHook", begin=2, end=5,
                                                      use_e2e_profiler=True)])
    runner.train()
    assert _NpuProfile.events == [("profile", str(tmp_path / "cann_profiling"), True),
                                  "enter", "exit"]
    assert (tmp_path / "cann_profiling").is_dir()
    assert runner.iter == 5  # exit_after_profiling: stopped after iteration 5 (index 4)
    assert any(kind == "stop" and "NPUProfilerHook" in reasons[0]
               for _, kind, reasons in runner.requests.log)
    runner = make_runner(tmp_path / "b", custom_hooks=[dict(type="NPUProfilerHook", end=50)])
    with pytest.raises(ConfigError, match=r"end: 50 is past the last iteration \(max_iters 30\)"):
        runner.train()


def test_profiler_passes_on_trace_ready_keys_through_and_defaults_as_mmengine(tmp_path):
    runner = make_runner(tmp_path, custom_hooks=[dict(
        type="ProfilerHook", by_epoch=False, profile_times=2,
        on_trace_ready=dict(type="tb_trace", worker_name="node7", use_gzip=True))])
    hook = runner.get_hook("profiler")
    assert hook.activity_with_cuda is False  # MMEngine's default
    runner.train()
    assert [p.name.split(".")[0] for p in (tmp_path / "tf_tracing_logs").iterdir()] == ["node7"]
    assert next((tmp_path / "tf_tracing_logs").iterdir()).name.endswith(".pt.trace.json.gz")

    runner = make_runner(tmp_path / "log", custom_hooks=[dict(
        type="ProfilerHook", by_epoch=False, profile_times=2,
        on_trace_ready=dict(type="log_trace", sort_by="cpu_time_total", row_limit=3))])
    runner.train()
    table = runner.get_hook("profiler").table
    lines = table.splitlines()
    rules = [i for i, line in enumerate(lines) if line.strip().startswith("---")]
    assert rules[2] - rules[1] - 1 == 3  # row_limit reached the table: 3 operator rows
    assert "CPU total" in table

    with pytest.raises(ConfigError, match=r"^custom_hooks\[0\].on_trace_ready.use_gzp: "
                                          r"torch.profiler.tensorboard_trace_handler takes no "
                                          r"'use_gzp'$"):
        make_runner(tmp_path, custom_hooks=[dict(type="ProfilerHook", on_trace_ready=dict(
            type="tb_trace", use_gzp=True))])
    with pytest.raises(ConfigError, match=r"on_trace_ready.rows: the operator table"):
        make_runner(tmp_path, custom_hooks=[dict(type="ProfilerHook", on_trace_ready=dict(
            type="log_trace", rows=3))])
