"""The training step is chosen once per run (distributed_runner/engine/step_choice.py's choose_step,
step.py's strategies): each kind of run gets its own, the loop calls that one, and the plain
step trains exactly the weights the general one does."""
from itertools import islice

import pytest
import torch

from distributed_runner.core.registry import MODELS
from distributed_runner.engine.step import ElasticStep, GuardedStep, OwnTrainStep, PlainStep
from distributed_runner.engine.step_choice import choose_step
from distributed_runner.model.base import BaseModel
from distributed_runner.optim.wrapper import OptimWrapper
from tests.toy import ToyModel, make_runner

SGD = dict(type="SGD", lr=0.1, momentum=0.9)


@MODELS.register_module(force=True)
class StepToyPreprocessed(BaseModel):
    """MMEngine's way: BaseModel, its default data_preprocessor."""

    def __init__(self) -> None:
        super().__init__()
        self.net = ToyModel(dropout=0.0)

    def forward(self, inputs, labels=None, mode="tensor"):
        return self.net(inputs, labels, mode="loss" if mode == "loss" else "predict")


@MODELS.register_module(force=True)
class StepToyOwnTrainStep(StepToyPreprocessed):
    """Its own train_step (BaseModel's sequence, but defined here: the Runner must call it)."""

    def train_step(self, data, optim_wrapper):
        return super().train_step(data, optim_wrapper)


KINDS = {
    "plain": (dict(), PlainStep),
    "step guard": (dict(custom_hooks=[dict(type="NonFiniteLossHook", policy="skip")]),
                   GuardedStep),
    "clipping": (dict(optim_wrapper=dict(optimizer=SGD, clip_grad=dict(max_norm=1.0))),
                 GuardedStep),
    "accumulation": (dict(optim_wrapper=dict(optimizer=SGD, accumulative_counts=2)),
                     GuardedStep),
    "preprocessor": (dict(model=dict(type="StepToyPreprocessed")), GuardedStep),
    "own train_step": (dict(model=dict(type="StepToyOwnTrainStep")), OwnTrainStep),
    "elastic": (dict(launcher=dict(type="ray", num_workers=(1, 2))), ElasticStep),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_kind_of_run_trains_with_its_step_chosen_once(tmp_path, kind):
    overrides, expected = KINDS[kind]
    runner = make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=1, val_interval=1),
                         **overrides)
    assert type(choose_step(runner)) is expected
    runner.train()
    step = runner.train_loop.step  # what the loop called: the chosen strategy, bound
    assert type(step.__self__) is expected and step == step.__self__.__call__
    assert runner.iter == len(runner.train_dataloader)
    if kind == "preprocessor":
        assert step.__self__.preprocess is runner.model.data_preprocessor
    if kind == "own train_step":
        assert step.__self__.average is False  # one process: nothing to average


def test_the_plain_step_trains_the_same_weights_as_the_general_one(tmp_path):
    plain_run = make_runner(tmp_path / "plain", model=dict(type="ToyModel", dropout=0.0))
    general_run = make_runner(tmp_path / "general", model=dict(type="ToyModel", dropout=0.0))
    general_run.model.load_state_dict(plain_run.model.state_dict())
    plain, general = choose_step(plain_run), GuardedStep(general_run)
    assert type(plain) is PlainStep
    for batch in islice(plain_run.train_dataloader, 6):
        as_tuple = (batch["inputs"], batch["labels"])  # the positional way, too
        for data in (batch, as_tuple):
            logged_plain, logged_general = plain(data), general(data)
            assert logged_plain.keys() == logged_general.keys()
            for key, value in logged_plain.items():
                assert torch.equal(value, logged_general[key]), key
    trained, reference = plain_run.model.state_dict(), general_run.model.state_dict()
    assert trained.keys() == reference.keys()
    for key, value in reference.items():
        assert torch.equal(trained[key], value), key
    assert not torch.equal(trained["fc1.weight"], make_runner(
        tmp_path / "untrained", model=dict(type="ToyModel", dropout=0.0)).model.fc1.weight)


def test_the_optim_wrapper_says_whether_it_is_plain_and_averages_through_its_own_api():
    params = [torch.nn.Parameter(torch.ones(2))]

    class Scaled(OptimWrapper):
        def update_params(self, loss):
            super().update_params(loss * 2)

    assert OptimWrapper(torch.optim.SGD(params, lr=0.1)).is_plain()
    assert not OptimWrapper(torch.optim.SGD(params, lr=0.1), accumulative_counts=2).is_plain()
    assert not OptimWrapper(torch.optim.SGD(params, lr=0.1),
                            clip_grad=dict(max_norm=1.0)).is_plain()
    assert not Scaled(torch.optim.SGD(params, lr=0.1)).is_plain()
    wrapper = OptimWrapper(torch.optim.SGD(params, lr=0.1))
    with wrapper.averaging_gradients():
        assert not wrapper.is_plain()
        (params[0] * 3).sum().backward()
        wrapper.step()  # one process: the mean over the ranks is the gradient itself
    assert wrapper.is_plain()
    torch.testing.assert_close(params[0].detach(), torch.full((2,), 0.7))
