"""Hooks of downstream OpenMMLab projects, as published in their wheels (tests/published.py), run
on our built-ins after changing only their imports. Each test lists the import lines it
rewrites; nothing else of the published file changes.

mmpretrain 1.2.0's ``EMAHook`` subclasses MMEngine's: it calls ``_swap_ema_parameters()`` and
``_swap_ema_state_dict(checkpoint)``, reads ``ema_model``, ``src_model`` and
``runner._resume``, re-runs validation through ``val_loop.run_iter`` and
``val_loop.evaluator.evaluate`` for ``evaluate_on_origin``, and expects MMEngine's checkpoint
layout (``state_dict`` = the average). mmyolo 0.6.0's ``YOLOv5ParamSchedulerHook`` subclasses
ParamSchedulerHook without calling its ``__init__``/``before_train``; its
``YOLOXModeSwitchHook`` rebuilds the train loader from ``runner.cfg`` with
``Runner.build_dataloader`` and assigns ``runner.train_loop.dataloader``."""
import pytest
import torch
from torch import nn

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import DATASETS, HOOKS, MODELS, Registry
from hooks import Hook
from tests.published import MMDET_HOOKS, published_module
from tests.toy import ToyDataset, ToyModel, assert_state_equal, make_runner, params_of

MMPRETRAIN_EMA_IMPORTS = {
    "from mmengine.hooks import EMAHook as BaseEMAHook":
        "from hooks.ema_hook import EMAHook as BaseEMAHook",
    "from mmengine.logging import MMLogger": "from distributed_runner.core.log import MMLogger",
    "from mmengine.runner import Runner": "from distributed_runner import Runner",
    "from mmpretrain.registry import HOOKS": "from tests.published import SCRATCH_HOOKS as HOOKS",
    "from mmengine.runner.checkpoint import load_state_dict":
        "from distributed_runner.checkpoint.files import load_state_dict",
}


@pytest.fixture(scope="module")
def mmpretrain_ema():
    return published_module("mmpretrain", "1.2.0", "mmpretrain/engine/hooks/ema_hook.py",
                            MMPRETRAIN_EMA_IMPORTS).EMAHook


def averaged(runner, name="EMAHook"):
    hook = next(h for h in runner.hooks if type(h).__name__ == name)
    return {k: v.clone() for k, v in hook.ema_model.module.state_dict().items()}


def test_mmpretrains_ema_hook_averages_and_writes_mmengines_layout(tmp_path, mmpretrain_ema):
    ours = make_runner(tmp_path / "ours", custom_hooks=[dict(type="EMAHook", momentum=0.2)])
    ours.train()
    theirs = make_runner(tmp_path / "theirs", custom_hooks=[mmpretrain_ema(momentum=0.2)])
    theirs.train()
    assert_state_equal(params_of(theirs.model), params_of(ours.model))  # training unchanged
    average = averaged(theirs)
    assert_state_equal(average, averaged(ours, "EMAHook"))
    assert not torch.equal(average["fc1.weight"], params_of(theirs.model)["fc1.weight"])
    ckpt = torch.load(tmp_path / "theirs" / "epoch_3.pth", weights_only=True)
    assert_state_equal(ckpt["state_dict"], average)  # what is deployed: the average
    assert_state_equal({k[len("module."):]: v for k, v in ckpt["ema_state_dict"].items()
                        if k != "steps"}, params_of(theirs.model))
    # validation ran on the average: the logged accuracy is the averaged model's
    val = [r for r in (tmp_path / "theirs" / "logs" / "scalars.jsonl").read_text().splitlines()
           if '"mode": "val"' in r]
    ours_val = [r for r in (tmp_path / "ours" / "logs" / "scalars.jsonl").read_text()
                .splitlines() if '"mode": "val"' in r]
    assert [v.split('"accuracy": ')[1][:6] for v in val] == \
        [v.split('"accuracy": ')[1][:6] for v in ours_val]


def test_mmpretrains_ema_hook_resumes_exactly_and_evaluates_on_origin(tmp_path, mmpretrain_ema):
    def hook():
        return mmpretrain_ema(momentum=0.2, evaluate_on_origin=True)

    full = make_runner(tmp_path / "full", custom_hooks=[hook()])
    full.train()
    resumed = make_runner(tmp_path / "resumed", custom_hooks=[hook()],
                          resume=str(tmp_path / "full" / "epoch_1.pth"))
    resumed.train()
    assert_state_equal(params_of(resumed.model), params_of(full.model))
    assert_state_equal(averaged(resumed), averaged(full))
    # evaluate_on_origin: validation re-run on the training weights, logged beside the average's
    origin = full.message_hub.get_scalar("val/accuracy_origin")
    assert origin is not None and len(origin.values()) == 3


# -- mmyolo 0.6.0's YOLOv5ParamSchedulerHook ------------------------------------------------------
MMYOLO_IMPORTS = {
    "from mmengine.hooks import ParamSchedulerHook": "from hooks import ParamSchedulerHook",
    "from mmengine.runner import Runner": "from distributed_runner import Runner",
    "from mmyolo.registry import HOOKS": "from tests.published import SCRATCH_HOOKS as HOOKS",
}


def test_mmyolos_yolov5_scheduler_hook_sets_its_warmup_and_decay_in_place_of_ours(tmp_path):
    """It subclasses ParamSchedulerHook without calling its __init__ or before_train and sets
    the learning rate itself (param_scheduler=None, as YOLOv5 configs have): a linear warm-up
    over ``warmup_mim_iter`` iterations to ``lr x scheduler(epoch)``, then the per-epoch decay."""
    module = published_module("mmyolo", "0.6.0",
                              "mmyolo/engine/hooks/yolov5_param_scheduler_hook.py",
                              MMYOLO_IMPORTS)
    hook = module.YOLOv5ParamSchedulerHook(scheduler_type="linear", lr_factor=0.1, max_epochs=3,
                                           warmup_epochs=1, warmup_mim_iter=15)
    seen = []

    class LrProbe(Hook):
        priority = "LOWEST"

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            seen.append(runner.optim_wrapper.get_lr()[0])

    runner = make_runner(tmp_path, param_scheduler=None, custom_hooks=[LrProbe()],
                         default_hooks=dict(param_scheduler=hook, checkpoint=None))
    runner.train()
    decay = [(1 - e / 3) * (1 - 0.1) + 0.1 for e in range(4)]  # its 'linear' rule, lr 0.1
    expected = []
    for i in range(30):  # 10 iterations an epoch
        if i <= 15:  # warm-up: from 0 to the epoch's decayed lr
            expected.append(i / 15 * 0.1 * decay[i // 10])
        else:  # then only at epoch ends, to lr x scheduler(the epoch that ended): epoch 1's
            expected.append(0.1 * decay[1])
    assert seen == pytest.approx(expected)


@DATASETS.register_module(force=True)
class PipelineToyDataset(ToyDataset):
    """ToyDataset with an MMDetection-style ``pipeline``: ``dict(type='Scale', factor=f)``
    multiplies the inputs, so which pipeline a batch came through is visible in the batch."""

    def __init__(self, n: int = 40, pipeline: list | None = None) -> None:
        super().__init__(n=n, with_index=True)
        self.factor = 1.0
        for step in pipeline or []:
            assert step["type"] == "Scale", step
            self.factor *= step["factor"]

    def __getitem__(self, i: int) -> dict:
        sample = super().__getitem__(i)
        return {**sample, "inputs": sample["inputs"] * self.factor}


@MODELS.register_module(force=True)
class ToyDetector(ToyModel):
    """ToyModel with a ``bbox_head`` whose ``use_bbox_aux`` flag the YOLOX hook turns on; it
    records each training batch's input scale (the pipeline) per epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.bbox_head = nn.Module()
        self.bbox_head.use_bbox_aux = False
        self.scales: list[float] = []

    def forward(self, inputs, labels=None, index=None, mode="predict"):
        if self.training:
            self.scales.append(round(float(inputs.abs().sum() / ToyDataset(n=40).x[index]
                                           .abs().sum()), 3))
        return super().forward(inputs, labels, index, mode)


def test_mmyolos_yolox_mode_switch_hook_rebuilds_the_loader_the_loop_then_iterates(tmp_path):
    """It deep-copies ``runner.cfg.train_dataloader``, swaps the dataset's pipeline, builds a
    loader with ``Runner.build_dataloader`` and assigns ``runner.train_loop.dataloader``, then
    sets ``model.bbox_head.use_bbox_aux`` — for the last ``num_last_epochs`` epochs."""
    module = published_module("mmyolo", "0.6.0", "mmyolo/engine/hooks/yolox_mode_switch_hook.py",
                              {"from mmengine.hooks import Hook": "from hooks import Hook",
                               "from mmengine.runner import Runner":
                                   "from distributed_runner import Runner",
                               "from mmyolo.registry import HOOKS":
                                   "from tests.published import SCRATCH_HOOKS as HOOKS",
                               "from mmengine.model import is_model_wrapper":
                                   "from distributed_runner.model.build import is_model_wrapper"})
    loader = dict(dataset=dict(type="PipelineToyDataset", n=40,
                               pipeline=[dict(type="Scale", factor=2.0)]),
                  batch_size=4, sampler=dict(type="DefaultSampler", shuffle=True))
    runner = make_runner(tmp_path, model=dict(type="ToyDetector"), train_dataloader=loader,
                         custom_hooks=[module.YOLOXModeSwitchHook(
                             num_last_epochs=1, new_train_pipeline=[dict(type="Scale",
                                                                         factor=0.5)])])
    runner.train()
    # its rule, (epoch + 1) == max_epochs - num_last_epochs, switches before the second epoch
    scales = runner.model.scales
    assert scales[:10] == [2.0] * 10 and scales[10:] == [0.5] * 20
    assert runner.model.bbox_head.use_bbox_aux is True
    seen = runner.model.seen  # the rebuilt loader covers the data once an epoch, reshuffled
    second, third = seen[40:80], seen[80:]
    assert sorted(second) == sorted(third) == list(range(40)) and second != third


# -- scoped registries: mmdet 3.3.0's CheckInvalidLossHook beside ours ------------------------------
@pytest.fixture(scope="module")
def mmdet_check_loss():
    return published_module("mmdet", "3.3.0", "mmdet/engine/hooks/checkloss_hook.py", {
        "from mmengine.hooks import Hook": "from hooks import Hook",
        "from mmengine.runner import Runner": "from distributed_runner import Runner",
        "from mmdet.registry import HOOKS":
            "from tests.published import MMDET_HOOKS as HOOKS"})


class NanAt(Hook):
    """Poisons the model after iteration ``at`` so that the next loss is NaN."""

    def __init__(self, at: int) -> None:
        self.at = at

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.at:
            with torch.no_grad():
                runner.model.fc2.bias.fill_(float("nan"))


def test_a_scoped_registry_holds_mmdets_hook_beside_ours_of_the_same_name(tmp_path,
                                                                          mmdet_check_loss):
    theirs = mmdet_check_loss.CheckInvalidLossHook
    assert MMDET_HOOKS.get("CheckInvalidLossHook") is theirs  # registered in its own scope
    assert HOOKS.get("mmdet.CheckInvalidLossHook") is theirs  # 'scope.Name' from the root
    ours = HOOKS.get("CheckInvalidLossHook")
    assert ours is not theirs and ours.__module__.startswith("hooks")
    assert MMDET_HOOKS.get("CheckpointHook") is HOOKS.get("CheckpointHook")  # the parent's

    def run(name, **cfg):
        runner = make_runner(tmp_path / name, custom_hooks=[
            dict(type=name, interval=1), NanAt(3)], **cfg)
        with pytest.raises(Exception) as raised:
            runner.train()
        return next(h for h in runner.hooks if type(h).__name__ == "CheckInvalidLossHook"), \
            raised.value

    hook, error = run("mmdet.CheckInvalidLossHook")
    assert type(hook) is theirs and type(error) is AssertionError  # theirs asserts it is finite
    hook, error = run("CheckInvalidLossHook", default_scope="mmdet")
    assert type(hook) is theirs and type(error) is AssertionError  # mmdet's scope first
    hook, error = run("CheckInvalidLossHook")
    assert type(hook) is ours and type(error) is FloatingPointError  # ours, at iteration 4
    assert "at iteration 4" in str(error)


def test_two_projects_may_register_one_name_and_a_wrong_scope_is_one_line(tmp_path):
    yolo_hooks = Registry("hook", parent=HOOKS, scope="mmyolo_test")
    det_hooks = Registry("hook", parent=HOOKS, scope="mmdet_test")

    @yolo_hooks.register_module()
    class SwitchHook(Hook):
        pass

    @det_hooks.register_module(name="SwitchHook")
    class OtherSwitchHook(Hook):
        pass

    assert HOOKS.get("mmyolo_test.SwitchHook") is SwitchHook
    assert HOOKS.get("mmdet_test.SwitchHook") is OtherSwitchHook
    assert HOOKS.get("SwitchHook") is None  # no default scope: the root's own names only
    with pytest.raises(ConfigError, match=r"custom_hooks\[0\].type: unknown hook "
                                          r"'mmyolo_tset.SwitchHook' \(did you mean "
                                          r"'mmyolo_test.SwitchHook'"):
        make_runner(tmp_path, custom_hooks=[dict(type="mmyolo_tset.SwitchHook")])
