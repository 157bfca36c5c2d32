"""Hooks of downstream OpenMMLab projects, as published in their wheels (tests/published.py), run
on our built-ins after changing only their imports. Each test lists the import lines it
rewrites; nothing else of the published file changes.

mmpretrain 1.2.0's ``EMAHook`` subclasses MMEngine's: it calls ``_swap_ema_parameters()`` and
``_swap_ema_state_dict(checkpoint)``, reads ``ema_model``, ``src_model`` and
``runner._resume``, re-runs validation through ``val_loop.run_iter`` and
``val_loop.evaluator.evaluate`` for ``evaluate_on_origin``, and expects MMEngine's checkpoint
layout (``state_dict`` = the average)."""
import pytest
import torch

from tests.published import published_module
from tests.toy import assert_state_equal, make_runner, params_of

MMPRETRAIN_EMA_IMPORTS = {
    "from mmengine.hooks import EMAHook as BaseEMAHook":
        "from hooks.ema_hook import EMAHook as BaseEMAHook",
    "from mmengine.logging import MMLogger": "from distributed_runner.log import MMLogger",
    "from mmengine.runner import Runner": "from distributed_runner import Runner",
    "from mmpretrain.registry import HOOKS": "from tests.published import SCRATCH_HOOKS as HOOKS",
    "from mmengine.runner.checkpoint import load_state_dict":
        "from distributed_runner.checkpoint import load_state_dict",
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
