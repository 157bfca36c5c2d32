"""User mistakes raise one line naming the config key and the fix, before training starts."""
import pytest

from distributed_runner import Runner
from distributed_runner.core.errors import ConfigError
from tests.toy import base_cfg


def build(tmp_path, **overrides):
    return Runner.from_cfg(base_cfg(tmp_path, **overrides))


@pytest.mark.parametrize("overrides,prefix,fragment", [
    (dict(model=dict(type="ToyModle")), "model.type", "did you mean 'ToyModel'"),
    (dict(model=dict(type="ToyModel", hiden=3)), "model.hiden", "did you mean 'hidden'"),
    (dict(model=dict(hidden=3)), "model", "missing 'type'"),
    (dict(optim_wrapper=dict(optimizer=dict(type="SDG", lr=0.1))), "optim_wrapper.optimizer.type",
     "did you mean 'SGD'"),
    (dict(optim_wrapper=dict(optimizer=dict(type="SGD", lrr=0.1))), "optim_wrapper.optimizer.lrr",
     "did you mean 'lr'"),
    (dict(optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1), clip_grad=dict(norm=1))),
     "optim_wrapper.clip_grad", "needs max_norm"),
    (dict(train_dataloader=dict(dataset=dict(type="ToyDataset"), batch_size=4, shuffle=True)),
     "train_dataloader.shuffle", "DefaultSampler"),
    (dict(train_dataloader=dict(dataset=dict(type="ToyDataset"))), "train_dataloader.batch_size",
     "missing"),
    (dict(train_dataloader=dict(dataset=dict(type="ToyDataset"), batch_size=2, num_worker=2)),
     "train_dataloader.num_worker", "did you mean 'num_workers'"),
    (dict(train_cfg=dict(by_epoch=True, max_epoch=3)), "train_cfg.max_epoch",
     "did you mean 'max_epochs'"),
    (dict(val_cfg=None), "val_cfg", "together"),
    (dict(optim_wrapper=None), "optim_wrapper", "together"),
    (dict(param_scheduler=dict(type="CosineAnealingLR")), "param_scheduler.type",
     "did you mean 'CosineAnnealingLR'"),
    (dict(train_cfg=dict(by_epoch=False, max_iters=10), param_scheduler=dict(type="StepLR",
                                                                           step_size=2)),
     "param_scheduler.by_epoch", "iteration-based"),
    (dict(randomness=dict(sead=1)), "randomness.sead", "unknown option"),
    (dict(val_evaluator=dict(type="Acuracy")), "val_evaluator.type", "did you mean 'Accuracy'"),
    (dict(default_hooks=dict(logger=dict(interval=0))), "default_hooks.logger.interval", ">= 1"),
    (dict(model=dict(type="ToyModel", hidden="wide")), "model",
     "ToyModel(...) rejected its arguments"),
])
def test_one_line_errors(tmp_path, overrides, prefix, fragment):
    with pytest.raises(ConfigError) as err:
        build(tmp_path, **overrides)
    msg = str(err.value)
    assert msg.startswith(prefix + ":"), msg
    assert fragment in msg and "\n" not in msg


def test_missing_work_dir_and_model(tmp_path):
    cfg = base_cfg(tmp_path)
    del cfg["work_dir"]
    with pytest.raises(ConfigError, match="^work_dir: missing"):
        Runner.from_cfg(cfg)
    cfg = base_cfg(tmp_path)
    del cfg["model"]
    with pytest.raises(ConfigError, match="^model: missing"):
        Runner.from_cfg(cfg)


def test_test_without_test_loop_is_one_line(tmp_path):
    runner = build(tmp_path)
    with pytest.raises(ConfigError, match="^test_dataloader: test\\(\\) needs"):
        runner.test()


def test_randomness_seed_drawn_when_missing_and_deterministic_flag(tmp_path):
    import torch

    a = build(tmp_path / "a", randomness=dict(seed=None))
    b = build(tmp_path / "b", randomness=dict(seed=None))
    assert isinstance(a.seed, int) and a.seed != b.seed
    try:
        build(tmp_path / "c", randomness=dict(seed=3, deterministic=True))
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_same_seed_same_initial_weights(tmp_path):
    import torch

    a = build(tmp_path / "a", randomness=dict(seed=7)).model.state_dict()
    b = build(tmp_path / "b", randomness=dict(seed=7)).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_config_errors_survive_pickling_as_between_a_ray_worker_and_the_driver():
    import pickle

    from distributed_runner.checkpoint.files import CheckpointDamaged
    from distributed_runner.core.errors import ArgumentError, ConfigError
    for error in (ConfigError("model.type", "unknown model 'X'"), ConfigError(None, "no key"),
                  ArgumentError("interval", "must be >= 1"), ArgumentError("", "whole"),
                  CheckpointDamaged("resume", "iter_4.pth: truncated")):
        error.add_note("raised in hook 'x'")
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error)
        assert (back.key, back.message, str(back)) == (error.key, error.message, str(error))
        assert back.__notes__ == ["raised in hook 'x'"]
