"""Ten more hooks from OpenMMLab wheels (mmengine 0.10.7, mmdet 3.3.0, mmpretrain 1.2.0, mmyolo
0.6.0, mmagic 1.2.0), loaded by tests/published.py with only the import lines below rewritten,
each checked for its effect on training — not just that it ran. With test_downstream_hooks.py
and test_mmengine_forwarding.py: sixteen hooks from five wheels (docs/how-to/mmengine-imix.md
lists them)."""
import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from distributed_runner.core.registry import DATASETS, MODELS
from hooks import Hook
from tests.published import mmengine_hook, published_module
from tests.toy import ToyDataset, make_runner

HOOK = {"from mmengine.hooks import Hook": "from hooks import Hook"}
RUNNER = {"from mmengine.runner import Runner": "from distributed_runner import Runner"}
WRAPPER = {"from mmengine.model.wrappers import is_model_wrapper":
           "from distributed_runner.model.base import is_model_wrapper"}


def registry(project: str) -> dict:
    return {f"from {project}.registry import HOOKS":
            "from tests.published import SCRATCH_HOOKS as HOOKS"}


def load(package: str, version: str, module: str, rewrites: dict) -> object:
    return published_module(package, version, f"{package}/engine/hooks/{module}.py", rewrites)


class Probe(Hook):
    """Runs after every other hook (LOWEST) and records ``read(runner)`` before each iteration
    or, with ``after=True``, after each."""

    priority = "LOWEST"

    def __init__(self, read, after: bool = False) -> None:
        self.read, self.after, self.seen = read, after, []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if not self.after:
            self.seen.append(self.read(runner))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if self.after:
            self.seen.append(self.read(runner))


@MODELS.register_module(force=True)
class Twins(nn.Module):
    """A trained ``net`` (also ``student`` / ``generator``) and a copy (``teacher`` /
    ``generator_ema``) that only hooks move; ``set_epoch``, ``loss_lambda``, ``head.temperature``
    and ``noise`` for the hooks that read or set them."""

    def __init__(self, num_classes: int = 2) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        self.copy = copy.deepcopy(self.net).requires_grad_(False)
        self.head = nn.Module()
        self.head.temperature, self.head.num_classes = 2.0, num_classes
        self.loss_lambda, self.epochs, self.noise = 0.5, [], torch.arange(3.0)

    student = generator = property(lambda self: self.net)
    teacher = generator_ema = property(lambda self: self.copy)

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def forward(self, inputs, labels=None, mode="predict"):
        logits = self.net(inputs)
        return {"loss": F.cross_entropy(logits, labels)} if mode == "loss" else logits


@DATASETS.register_module(force=True)
class NamedToyDataset(ToyDataset):
    CLASSES = ("negative", "positive")  # what mmpretrain's datasets expose


def params(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def initial_net(tmp_path) -> list[torch.Tensor]:
    """The trained net's weights before training (the same seed builds the same model)."""
    return params(make_runner(tmp_path / "initial", model=dict(type="Twins")).model.net)


def train(tmp_path, hooks, **extra):
    runner = make_runner(tmp_path, model=extra.pop("model", dict(type="Twins")),
                         custom_hooks=hooks, **extra)
    runner.train()
    return runner


def test_mmdets_set_epoch_info_and_mean_teacher_hooks(tmp_path):
    set_epoch = load("mmdet", "3.3.0", "set_epoch_info_hook", {**HOOK, **WRAPPER,
                                                                 **registry("mmdet")})
    teacher = load("mmdet", "3.3.0", "mean_teacher_hook", {
        **HOOK, **RUNNER, **registry("mmdet"), "from mmengine.model import is_model_wrapper":
        "from distributed_runner.model.base import is_model_wrapper"})
    student = Probe(lambda runner: params(runner.model.student), after=True)
    runner = train(tmp_path, [set_epoch.SetEpochInfoHook(),
                              teacher.MeanTeacherHook(momentum=0.2), student])
    assert runner.model.epochs == [0, 1, 2]
    # before_train: the teacher becomes the (initial) student; after each step it moves 0.2
    # of the way to the student
    expected = initial_net(tmp_path)
    for step in student.seen:
        expected = [0.8 * t + 0.2 * s for t, s in zip(expected, step)]
    assert len(student.seen) == 30
    for got, want in zip(params(runner.model.teacher), expected):
        torch.testing.assert_close(got, want)


def test_mmpretrains_densecl_warmup_param_and_simsiam_hooks(tmp_path):
    utils = {"from mmpretrain.utils import get_ori_model":
             "from distributed_runner.model.base import get_ori_model"}
    densecl = load("mmpretrain", "1.2.0", "densecl_hook", {**HOOK, **registry("mmpretrain"),
                                                           **utils})
    warmup = load("mmpretrain", "1.2.0", "warmup_param_hook", {**HOOK, **registry("mmpretrain"),
                                                               **utils})
    simsiam = load("mmpretrain", "1.2.0", "simsiam_hook", {**HOOK, **registry("mmpretrain")})
    probe = Probe(lambda runner: (runner.model.loss_lambda, runner.model.head.temperature,
                                  [g["lr"] for g in runner.optim_wrapper.param_groups]))
    train(tmp_path, [densecl.DenseCLHook(start_iters=12),
                     warmup.WarmupParamHook("temperature", "head", warmup_epochs=1),
                     simsiam.SimSiamHook(fix_pred_lr=True, lr=0.05), probe],
          optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1),
                             paramwise_cfg=dict(custom_keys={"net.2": dict(fix_lr=True)})),
          param_scheduler=dict(type="StepLR", step_size=1, gamma=0.5, by_epoch=True))
    lambdas, temperatures, lrs = zip(*probe.seen)
    assert lambdas == (0.0,) * 12 + (0.5,) * 18  # DenseCL: loss_lambda off until start_iters
    assert temperatures == pytest.approx([2.0 * min(1, i / 10) for i in range(30)])
    # SimSiam: the predictor's group (fix_lr) keeps lr 0.05 while the schedule halves the rest
    fixed = [lr for group in lrs for lr in group[2:]]  # custom key groups come after the rest
    assert set(fixed) == {0.05}
    assert sorted({group[0] for group in lrs}) == pytest.approx([0.025, 0.05, 0.1])


def test_mmpretrains_class_num_check_hook_passes_and_refuses(tmp_path):
    check = load("mmpretrain", "1.2.0", "class_num_check_hook", {
        **HOOK, **registry("mmpretrain"),
        "from mmengine.utils import is_seq_of": "from distributed_runner.compat.mmengine_utils import is_seq_of"})
    data = dict(dataset=dict(type="NamedToyDataset", n=40), batch_size=4,
                sampler=dict(type="DefaultSampler", shuffle=True))
    val = dict(data, dataset=dict(type="NamedToyDataset", n=20, seed=1))
    train(tmp_path / "ok", [check.ClassNumCheckHook()], train_dataloader=data,
          val_dataloader=val)
    with pytest.raises(AssertionError, match=r"The `num_classes` \(3\) in Module of Twins does "
                                             r"not matches the length of class information"):
        train(tmp_path / "wrong", [check.ClassNumCheckHook()], train_dataloader=data,
              val_dataloader=val, model=dict(type="Twins", num_classes=3))


def test_mmyolos_ppyoloe_scheduler_hook_warms_up_then_anneals(tmp_path):
    module = load("mmyolo", "0.6.0", "ppyoloe_param_scheduler_hook", {
        "from mmengine.hooks import ParamSchedulerHook": "from hooks import ParamSchedulerHook",
        **RUNNER, **registry("mmyolo")})
    hook = module.PPYOLOEParamSchedulerHook(warmup_min_iter=5, warmup_epochs=1,
                                            min_lr_ratio=0.1, total_epochs=3)
    probe = Probe(lambda runner: runner.optim_wrapper.get_lr()[0])
    make_runner(tmp_path, param_scheduler=None, custom_hooks=[probe],
                default_hooks=dict(param_scheduler=hook)).train()
    expected = [0.1 * i / 10 if i <= 10 else
                0.01 + 0.09 * 0.5 * (math.cos((i - 10) * math.pi / 20) + 1) for i in range(30)]
    assert probe.seen == pytest.approx(expected)


def test_mmagics_ema_and_pickle_data_hooks(tmp_path):
    ema = load("mmagic", "1.2.0", "ema", {
        **HOOK, **WRAPPER, **RUNNER, **registry("mmengine"),
        "from mmengine.utils import is_tuple_of": "from distributed_runner.compat.mmengine_utils import "
                                                  "is_tuple_of"})
    pickler = load("mmagic", "1.2.0", "pickle_data_hook", {
        **HOOK, **RUNNER, **registry("mmagic"),
        "from mmengine import is_list_of, mkdir_or_exist, print_log":
            "from distributed_runner.compat.mmengine_utils import is_list_of, mkdir_or_exist, print_log",
        "from mmengine.dist import master_only": "from distributed_runner.core.dist import master_only"})
    generator = Probe(lambda runner: params(runner.model.generator), after=True)
    runner = train(tmp_path, [
        ema.ExponentialMovingAverageHook(module_keys=("generator_ema",), interval=1,
                                         interp_cfg=dict(momentum=0.1)),
        pickler.PickleDataHook(output_dir="pickles", data_name_list=["noise", "missing"],
                               interval=10, after_run=True),
        generator])
    expected = initial_net(tmp_path)
    for step in generator.seen:  # lerp: ema + (weights - ema) x 0.1, from the initial copy
        expected = [e + (s - e) * 0.1 for e, s in zip(expected, step)]
    for got, want in zip(params(runner.model.generator_ema), expected):
        torch.testing.assert_close(got, want)
    names = sorted(p.name for p in (tmp_path / "pickles").iterdir())
    assert names == ["iter_10.pkl", "iter_20.pkl", "iter_30.pkl", "iter_31.pkl"]
    saved = pickle.loads((tmp_path / "pickles" / "iter_20.pkl").read_bytes())
    assert list(saved) == ["noise"] and saved["noise"].tolist() == [0.0, 1.0, 2.0]


def test_mmengines_dist_sampler_seed_hook_reshuffles_each_epoch_as_ours(tmp_path):
    theirs = mmengine_hook("sampler_seed_hook.py").DistSamplerSeedHook()
    data = dict(dataset=dict(type="ToyDataset", n=40, with_index=True), batch_size=4,
                sampler=dict(type="DefaultSampler", shuffle=True))
    orders = {}
    for name, hook in (("ours", "DistSamplerSeedHook"), ("theirs", theirs), ("none", None)):
        runner = make_runner(tmp_path / name, model=dict(type="ToyModel"), train_dataloader=data,
                             default_hooks=dict(sampler_seed=hook and (
                                 dict(type=hook) if isinstance(hook, str) else hook)))
        runner.train()
        seen = runner.model.seen
        orders[name] = [seen[i:i + 40] for i in range(0, 120, 40)]
    assert orders["theirs"] == orders["ours"]
    assert orders["theirs"][0] != orders["theirs"][1]  # a new permutation each epoch
    assert orders["none"][0] == orders["none"][1]  # without the hook: the same one
