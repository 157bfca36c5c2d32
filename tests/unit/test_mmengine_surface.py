"""The runner, registry and helper surface downstream MMEngine hooks use (issue: MMEngine and
iMIX parity): each as MMEngine's call shape expects it, with its effect checked."""
import logging

import pytest
import torch
from torch import nn

from distributed_runner import Runner
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.log import current_logger, print_log
from distributed_runner.core.registry import MODELS
from distributed_runner.model.build import get_ori_model, is_model_wrapper
from hooks import Hook
from tests.toy import ToyModel, make_runner


def test_registry_build_takes_mmengines_call_shape():
    built = MODELS.build(dict(type="Linear", in_features=2, out_features=3))
    assert isinstance(built, nn.Linear) and built.out_features == 3
    with_defaults = MODELS.build(dict(type="Linear", in_features=2),
                                 default_args=dict(out_features=4, not_taken=1))
    assert with_defaults.out_features == 4  # defaults the class does not take are left out
    with pytest.raises(ConfigError, match=r"^MODELS.build\(type='Lineer'\).type: unknown model 'Lineer' \(did you mean 'Linear'"):
        MODELS.build(dict(type="Lineer"))


def test_model_wrapper_helpers():
    model = ToyModel()
    assert not is_model_wrapper(model) and get_ori_model(model) is model
    wrapped = nn.DataParallel(model)
    assert is_model_wrapper(wrapped) and get_ori_model(wrapped) is model
    from distributed_runner.model.tta import TTAModel
    tta = TTAModel(wrapped)
    assert is_model_wrapper(tta) and get_ori_model(tta) is model


def test_print_log_and_current_logger(capsys, runlog):
    print_log("to stdout")
    assert capsys.readouterr().out == "to stdout\n"
    print_log("to the run's log", logger="current", level=logging.WARNING)
    print_log("dropped", logger="silent")
    print_log("by instance", logger=current_logger())
    messages = list(dict.fromkeys(r.getMessage() for r in runlog.records))  # root may see it too
    assert messages == ["to the run's log", "by instance"]
    with pytest.raises(TypeError, match="print_log: logger must be"):
        print_log("x", logger=3)


class SwitchLoaderHook(Hook):
    """As mmyolo's YOLOXModeSwitchHook: at an epoch, rebuild the train loader with
    ``Runner.build_dataloader`` and assign it to ``runner.train_dataloader`` (before
    DistSamplerSeedHook sets the epoch of the loader in use)."""

    priority = "ABOVE_NORMAL"

    def __init__(self, at_epoch: int) -> None:
        self.at_epoch, self.lengths, self.sampler_epochs = at_epoch, [], []

    def before_train_epoch(self, runner) -> None:
        if runner.epoch == self.at_epoch:
            runner.train_dataloader = Runner.build_dataloader(
                dict(dataset=dict(type="ToyDataset", n=24), batch_size=4,
                     sampler=dict(type="DefaultSampler", shuffle=True)), seed=7)
        self.lengths.append(len(runner.train_dataloader))

    def after_train_epoch(self, runner) -> None:
        self.sampler_epochs.append(runner.train_dataloader.sampler.epoch)


def test_a_loader_assigned_to_runner_train_dataloader_is_what_training_iterates(tmp_path):
    hook = SwitchLoaderHook(at_epoch=1)
    runner = make_runner(tmp_path, custom_hooks=[hook],
                         train_cfg=dict(by_epoch=True, max_epochs=3))
    runner.train()
    assert hook.lengths == [10, 6, 6]  # 40 samples, then 24, batch 4
    assert runner.iter == 10 + 6 + 6 and runner.train_loop.dataloader is runner.train_dataloader
    assert hook.sampler_epochs == [0, 1, 2]  # DistSamplerSeedHook reshuffles the new loader too
    eval_only = make_runner(tmp_path / "eval", train_dataloader=None, train_cfg=None,
                            optim_wrapper=None)
    assert eval_only.train_dataloader is None


def test_build_dataloader_seeds_as_told():
    spec = dict(dataset=dict(type="ToyDataset", n=16), batch_size=4,
                sampler=dict(type="DefaultSampler", shuffle=True))
    same = [list(Runner.build_dataloader(dict(spec), seed=3).sampler) for _ in range(2)]
    other = list(Runner.build_dataloader(dict(spec), seed=4).sampler)
    assert same[0] == same[1] != other
    assert torch.equal(torch.tensor(same[0]).sort().values, torch.arange(16))
