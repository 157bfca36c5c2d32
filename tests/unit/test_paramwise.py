"""``optim_wrapper.paramwise_cfg`` and ``constructor`` (distributed_runner/optim/constructor.py):
the per-parameter groups are the ones MMEngine's published DefaultOptimWrapperConstructor builds
(its module loaded from the mmengine 0.10.7 wheel, only its imports replaced), a run with them
trains and resumes exactly, and mistakes are one line."""
import pytest
import torch
from torch import nn

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import OPTIM_WRAPPER_CONSTRUCTORS
from distributed_runner.launch.launcher import validate_config
from distributed_runner.optim.constructor import DefaultOptimWrapperConstructor
from distributed_runner.optim.wrapper import build_optim_wrapper
from tests.published import published_module
from tests.toy import make_runner, params_of

# the published module's imports, replaced by what they provide (MMEngine's registries are not
# needed to call add_params; mmcv is not installed, so no deformable convolutions)
REWRITES = {
    "from mmengine.logging import print_log":
        "print_log = lambda *args, **kwargs: None",
    "from mmengine.registry import (OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS,\n"
    "                               OPTIMIZERS)":
        "from distributed_runner.core.registry import Registry\n"
        "OPTIM_WRAPPER_CONSTRUCTORS = Registry('constructor', 'scratch')",
    "from mmengine.utils import is_list_of":
        "is_list_of = lambda seq, kind: all(isinstance(x, kind) for x in seq)",
    "from mmengine.utils.dl_utils import mmcv_full_available":
        "mmcv_full_available = lambda: False",
    "from mmengine.utils.dl_utils.parrots_wrapper import _BatchNorm, _InstanceNorm":
        "from torch.nn.modules.batchnorm import _BatchNorm\n"
        "from torch.nn.modules.instancenorm import _InstanceNorm",
    "from .optimizer_wrapper import OptimWrapper": "OptimWrapper = None",
}


@pytest.fixture(scope="module")
def mmengine_constructor():
    module = published_module("mmengine", "0.10.7",
                              "mmengine/optim/optimizer/default_constructor.py", REWRITES)
    return module.DefaultOptimWrapperConstructor


class Net(nn.Module):
    """Every kind of parameter the rules tell apart: convolutions (one depthwise), BatchNorm,
    GroupNorm, LayerNorm, linear layers with and without bias, a bare 1-D parameter, a frozen
    layer and a module shared by two names (tied weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8),
                                      nn.Conv2d(8, 8, 3, groups=8), nn.GroupNorm(2, 8))
        self.neck = nn.Sequential(nn.Linear(8, 8, bias=False), nn.LayerNorm(8))
        self.head = nn.Linear(8, 2)
        self.aux_head = nn.Linear(8, 2)
        self.aux_head.weight = self.head.weight  # tied: one parameter in two modules
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)
        self.scale = nn.Parameter(torch.ones(2))


OPTIMIZER = dict(type="AdamW", lr=0.01, weight_decay=0.05)
CASES = {
    "multipliers": dict(bias_lr_mult=2.0, bias_decay_mult=0.5, norm_decay_mult=0.0,
                        dwconv_decay_mult=0.1, flat_decay_mult=0.3, bypass_duplicate=True),
    "custom_keys": dict(custom_keys={"backbone": dict(lr_mult=0.1, decay_mult=0.9),
                                     "backbone.1": dict(lr_mult=0.5),
                                     "head": dict(lr_mult=2.0, betas=(0.8, 0.9)),
                                     "eck": dict(lr_mult=3.0), "nec": dict(lr_mult=4.0)},
                        norm_decay_mult=0.0, bias_lr_mult=5.0, bypass_duplicate=True),
}


def groups(constructor_cls, paramwise, names):
    params = []
    constructor_cls(dict(optimizer=OPTIMIZER), paramwise).add_params(params, NET)
    return [({k: v for k, v in g.items() if k != "params"}, [names[id(p)] for p in g["params"]])
            for g in params]


NET = Net()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_groups_are_the_ones_mmengine_builds(mmengine_constructor, case):
    names = {id(p): n for n, p in NET.named_parameters()}
    ours = groups(DefaultOptimWrapperConstructor, CASES[case], names)
    theirs = groups(mmengine_constructor, CASES[case], names)
    assert ours == theirs
    assert len({tuple(sorted(g)) for g, _ in ours}) > 2  # the rules did set different options
    assert "frozen.weight" not in sum((p for _, p in ours), [])


def test_the_optimizer_gets_the_groups_and_a_shared_weight_needs_bypass_duplicate():
    paramwise = dict(CASES["custom_keys"])
    wrapper = build_optim_wrapper(dict(optimizer=OPTIMIZER, paramwise_cfg=paramwise), NET)
    lrs = {id(p): g["lr"] for g in wrapper.param_groups for p in g["params"]}
    assert lrs[id(NET.backbone[0].weight)] == pytest.approx(0.001)
    assert lrs[id(NET.backbone[1].weight)] == pytest.approx(0.005)  # the longer key wins
    assert lrs[id(NET.neck[0].weight)] == pytest.approx(0.03)  # 'eck' before 'nec'
    assert lrs[id(NET.scale)] == pytest.approx(0.01)
    del paramwise["bypass_duplicate"]
    with pytest.raises(ConfigError, match=r"paramwise_cfg.bypass_duplicate: parameter "
                                          r"(aux_)?head.weight is shared .* "
                                          r"set bypass_duplicate=True"):
        build_optim_wrapper(dict(optimizer=OPTIMIZER, paramwise_cfg=paramwise), NET)


@pytest.mark.parametrize("optim,key,message", [
    (dict(optimizer=OPTIMIZER, paramwise_cfg=dict(bias_lr_mul=2.0)),
     "optim_wrapper.paramwise_cfg.bias_lr_mul", "did you mean 'bias_lr_mult'"),
    (dict(optimizer=dict(type="SGD", lr=0.1), paramwise_cfg=dict(norm_decay_mult=0.0)),
     "optim_wrapper.paramwise_cfg.norm_decay_mult", "add weight_decay"),
    (dict(optimizer=OPTIMIZER, paramwise_cfg=dict(custom_keys={"head": 2.0})),
     "optim_wrapper.paramwise_cfg.custom_keys", "lr_mult"),
    (dict(optimizer=OPTIMIZER, constructor="LayerDecayConstructor"),
     "optim_wrapper.constructor", "LayerDecayConstructor"),
])
def test_mistakes_are_one_line_on_the_driver_too(tmp_path, optim, key, message):
    for build in (lambda: make_runner(tmp_path, optim_wrapper=optim),
                  lambda: validate_config(dict(work_dir=str(tmp_path), model=dict(
                      type="ToyModel"), optim_wrapper=optim))):
        with pytest.raises(ConfigError) as raised:
            build()
        assert raised.value.key == key and message in str(raised.value)


def test_a_run_with_paramwise_groups_trains_and_resumes_exactly(tmp_path):
    optim = dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9, weight_decay=1e-3),
                 paramwise_cfg=dict(norm_decay_mult=0.0, bias_lr_mult=2.0,
                                    custom_keys={"fc2": dict(lr_mult=0.5)}))
    full = make_runner(tmp_path / "full", optim_wrapper=optim)
    full.train()
    lrs = sorted({round(g["lr"], 6) for g in full.optim_wrapper.param_groups})
    assert len(full.optim_wrapper.param_groups) > 3 and len(lrs) >= 2
    resumed = make_runner(tmp_path / "resumed", optim_wrapper=optim,
                          resume=str(tmp_path / "full" / "epoch_1.pth"))
    resumed.train()
    a, b = params_of(full.model), params_of(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_registered_constructor_that_overrides_add_params_is_used(tmp_path):
    @OPTIM_WRAPPER_CONSTRUCTORS.register_module(force=True)
    class HalfLrForFirstLayer(DefaultOptimWrapperConstructor):
        """As downstream layer-decay constructors do: its own option, its own add_params."""

        def add_params(self, params, module, prefix="", is_dcn_module=None):
            factor = self.paramwise_cfg.get("first_layer_factor", 1.0)
            for name, param in module.named_parameters():
                lr = self.base_lr * (factor if name.startswith("fc1") else 1.0)
                params.append({"params": [param], "lr": lr})

    runner = make_runner(tmp_path, optim_wrapper=dict(
        optimizer=dict(type="SGD", lr=0.1), constructor="HalfLrForFirstLayer",
        paramwise_cfg=dict(first_layer_factor=0.5)))
    lrs = {n: g["lr"] for n, p in runner.model.named_parameters()
           for g in runner.optim_wrapper.param_groups if any(q is p for q in g["params"])}
    assert lrs["fc1.weight"] == pytest.approx(0.05) and lrs["fc2.weight"] == pytest.approx(0.1)
