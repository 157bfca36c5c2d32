"""Models written MMEngine's way: a ``data_preprocessor``, ``forward(inputs, data_samples,
mode)``, and ``train_step(data, optim_wrapper)`` / ``val_step`` / ``test_step`` overrides are
honoured — in one process and on 2 gloo processes with DDP, where an overridden train_step
bypasses DDP's forward and the Runner averages its gradients."""
import json

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import MODELS
from distributed_runner.model.base import BaseDataPreprocessor, BaseModel
from tests.toy import free_port, gloo_rank, make_runner


@MODELS.register_module(force=True)
class Standardize(BaseDataPreprocessor):
    """Rescales the inputs on the device and renames the keys as MMEngine's preprocessors do;
    records the ``training`` flag of every call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bool] = []

    def forward(self, data, training=False):
        data = self.cast_data(data)
        self.calls.append(training)
        return {"inputs": data["inputs"] * 2 - 0.5, "data_samples": data["labels"]}


@MODELS.register_module(force=True)
class Mlp(nn.Module):
    """The plain reference: rescales in forward what Standardize rescales outside."""

    def __init__(self, rescale: bool = True) -> None:
        super().__init__()
        self.fc1, self.fc2, self.rescale = nn.Linear(4, 8), nn.Linear(8, 2), rescale

    def forward(self, inputs, labels=None, mode="predict"):
        x = inputs * 2 - 0.5 if self.rescale else inputs
        logits = self.fc2(F.relu(self.fc1(x)))
        return {"loss": F.cross_entropy(logits, labels)} if mode == "loss" else logits


@MODELS.register_module(force=True)
class MMEngineMlp(BaseModel):
    def __init__(self, data_preprocessor=None) -> None:
        super().__init__(data_preprocessor or dict(type="Standardize"))
        self.net = Mlp(rescale=False)
        self.val_calls = 0

    def forward(self, inputs, data_samples=None, mode="tensor"):
        return self.net(inputs, data_samples, mode="loss" if mode == "loss" else "predict")


@MODELS.register_module(force=True)
class OwnStepMlp(MMEngineMlp):
    """Its own train_step halves the loss before the update (so it trains as lr/2 would) and logs
    a value of its own; its own val_step counts its calls."""

    def train_step(self, data, optim_wrapper):
        with optim_wrapper.optim_context(self):
            losses = self._run_forward(self.data_preprocessor(data, True), mode="loss")
        loss, log_vars = self.parse_losses(losses)
        optim_wrapper.update_params(loss * 0.5)
        return {**log_vars, "own_step": torch.tensor(7.0)}

    def val_step(self, data):
        self.val_calls += 1
        return super().val_step(data)

    def test_step(self, data):
        self.test_calls = getattr(self, "test_calls", 0) + 1
        return super().test_step(data)


def run(work_dir, model, lr=0.1, **extra):
    runner = make_runner(work_dir, model=model, optim_wrapper=dict(
        optimizer=dict(type="SGD", lr=lr, momentum=0.9)), **extra)
    runner.train()
    return runner


def net_params(runner):
    module = runner.model
    module = getattr(module, "net", module)
    return {k: v.detach().clone() for k, v in module.named_parameters()}


def test_a_data_preprocessor_sees_every_batch_and_the_model_trains_as_the_plain_one(tmp_path):
    torch.manual_seed(0)
    plain = run(tmp_path / "plain", dict(type="Mlp"))
    styled = run(tmp_path / "styled", dict(type="MMEngineMlp"))
    for key, value in net_params(plain).items():
        torch.testing.assert_close(net_params(styled)[key], value, rtol=0, atol=1e-6)
    calls = styled.model.data_preprocessor.calls
    # 3 epochs x 10 training batches (training=True), 3 validations x 3 batches (False)
    assert calls.count(True) == 30 and calls.count(False) == 9
    assert styled.message_hub.get_scalar("val/accuracy").current() == \
        plain.message_hub.get_scalar("val/accuracy").current()
    assert styled.model.data_preprocessor.device == torch.device("cpu")


def test_an_own_train_step_and_val_step_are_called_and_their_effect_kept(tmp_path):
    half_lr = run(tmp_path / "half", dict(type="MMEngineMlp"), lr=0.05)
    own = run(tmp_path / "own", dict(type="OwnStepMlp"), lr=0.1)
    for key, value in net_params(half_lr).items():  # loss x 0.5 with SGD = lr x 0.5
        torch.testing.assert_close(net_params(own)[key], value, rtol=1e-5, atol=1e-6)
    assert own.message_hub.get_scalar("train/own_step").current() == 7.0
    assert own.model.val_calls == 9  # its val_step, for each of 3 batches x 3 validations
    with pytest.raises(ConfigError, match=r"^custom_hooks: NonFiniteLossHook checks the loss "
                                          r"between forward and backward, but OwnStepMlp"):
        run(tmp_path / "guard", dict(type="OwnStepMlp"),
            custom_hooks=[dict(type="NonFiniteLossHook", policy="skip")])


def test_an_elastic_range_preprocesses_each_micro_batch_and_refuses_an_own_train_step(tmp_path):
    """Alone, an elastic (1, 2) group trains each global batch of 8 as 2 micro-batches of 4, each
    through the data_preprocessor: as the plain model with batch 8 (to float tolerance)."""
    elastic = dict(type="ray", num_workers=(1, 2))
    torch.manual_seed(0)
    plain = run(tmp_path / "plain", dict(type="Mlp"), train_dataloader=dict(
        dataset=dict(type="ToyDataset", n=40), batch_size=8,
        sampler=dict(type="DefaultSampler", shuffle=True)))
    styled = run(tmp_path / "styled", dict(type="MMEngineMlp"), launcher=elastic)
    for key, value in net_params(plain).items():
        torch.testing.assert_close(net_params(styled)[key], value, rtol=1e-5, atol=1e-6)
    # 3 epochs x 5 global batches x 2 micro-batches (training=True), 3 validations x 3 (False)
    calls = styled.model.data_preprocessor.calls
    assert calls.count(True) == 30 and calls.count(False) == 9
    with pytest.raises(ConfigError, match=r"^launcher.num_workers: an elastic range .* so "
                                          r"OwnStepMlp.train_step would not run: use a fixed "
                                          r"number of workers$"):
        run(tmp_path / "own", dict(type="OwnStepMlp"), launcher=elastic)


def test_base_model_is_mmengines_contract():
    with pytest.raises(NotImplementedError, match="must be implemented"):
        BaseModel()(torch.zeros(1))
    model = MMEngineMlp(data_preprocessor=Standardize())
    assert isinstance(model.data_preprocessor, Standardize)
    with pytest.raises(TypeError, match="data_preprocessor must be an nn.Module"):
        BaseModel(data_preprocessor="Standardize")


# -- 2 gloo processes, DDP ------------------------------------------------------------------------
def _worker(rank: int, port: int, out: str) -> None:
    with gloo_rank(rank, port):
        from distributed_runner import Runner
        from tests.toy import base_cfg
        for name, model, lr in (("half_lr", "MMEngineMlp", 0.05), ("own", "OwnStepMlp", 0.1)):
            cfg = base_cfg(f"{out}/{name}", model=dict(type=model), strategy="ddp",
                           optim_wrapper=dict(optimizer=dict(type="SGD", lr=lr, momentum=0.9)))
            runner = Runner.from_cfg(cfg)
            runner.train()
            torch.save(net_params(runner), f"{out}/{name}_rank{rank}.pt")
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump({"wrapped": type(runner.wrapped_model).__name__}, f)


@pytest.mark.timeout(300)
def test_under_ddp_an_own_train_step_has_its_gradients_averaged_over_ranks(tmp_path):
    mp.spawn(_worker, args=(free_port(), str(tmp_path)), nprocs=2, join=True)
    assert json.loads((tmp_path / "rank0.json").read_text()) == \
        {"wrapped": "DistributedDataParallel"}
    load = lambda name, rank: torch.load(tmp_path / f"{name}_rank{rank}.pt")  # noqa: E731
    own0, own1, reference = load("own", 0), load("own", 1), load("half_lr", 0)
    for key in reference:
        # the ranks saw different batches: without averaging their weights would differ
        assert torch.equal(own0[key], own1[key]), key
        # and they train what the Runner's own DDP step trains at half the learning rate
        torch.testing.assert_close(own0[key], reference[key], rtol=1e-5, atol=1e-6)


def test_under_test_time_augmentation_the_views_reach_the_model(tmp_path):
    """PrepareTTAHook's wrapper calls forward once per view; an own test_step must not bypass
    it (the preprocessor still runs first)."""
    data = dict(dataset=dict(type="ToyDataset", n=20, seed=1), batch_size=4,
                sampler=dict(type="DefaultSampler", shuffle=False))
    runner = make_runner(tmp_path, model=dict(type="OwnStepMlp"), test_dataloader=data,
                         test_evaluator=dict(type="Accuracy"), test_cfg=dict(),
                         custom_hooks=[dict(type="PrepareTTAHook", tta_cfg=dict(
                             type="TTAModel", transforms=["Identity", "Identity"]))])
    calls = []
    runner.model.net.register_forward_hook(lambda *args: calls.append(1))
    runner.test()
    assert len(calls) == 5 * 2  # 5 batches x 2 views, through the TTA wrapper
    assert not hasattr(runner.model, "test_calls")
    assert runner.model.data_preprocessor.calls == [False] * 5
