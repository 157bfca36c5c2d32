"""``compile=`` (MMEngine's key): the loops call a ``torch.compile``d model, and nothing else
changes: the same weights as eager, the same checkpoint keys, EMA and hooks on the user's module."""
import pytest
import torch

from distributed_runner.checkpoint.files import model_state_from
from distributed_runner.core.errors import ConfigError
from distributed_runner.model.build import get_ori_model
from tests.toy import make_runner, params_of

NO_VAL = dict(val_dataloader=None, val_evaluator=None, val_cfg=None)
# no dropout: a compiled graph draws dropout masks from its own generator, not eager's
DETERMINISTIC = dict(NO_VAL, model=dict(type="ToyModel", dropout=0.0),
                     train_cfg=dict(by_epoch=True, max_epochs=2),
                     randomness=dict(seed=3))


def test_inductor_compiled_training_matches_eager_and_keeps_the_users_module(tmp_path):
    eager = make_runner(tmp_path / "eager", **DETERMINISTIC)
    eager.train()
    compiled = make_runner(tmp_path / "compiled", compile=True, **DETERMINISTIC)
    assert type(compiled.wrapped_model).__name__ == "OptimizedModule"
    assert type(compiled.model).__name__ == "ToyModel"
    assert get_ori_model(compiled.wrapped_model) is compiled.model
    compiled.train()
    a, b = params_of(eager.model), params_of(compiled.model)
    assert a.keys() == b.keys()
    moved = max((a[k].float() - params_of(make_runner(tmp_path / "init", **DETERMINISTIC)
                                          .model)[k].float()).abs().max() for k in a)
    assert moved > 1e-3  # training did change the weights, so agreeing below means something
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)


def test_a_compiled_runs_checkpoint_loads_into_an_eager_model_and_back(tmp_path):
    compiled = make_runner(tmp_path / "c", compile=dict(backend="eager"), **DETERMINISTIC)
    compiled.train()
    ckpt = torch.load(tmp_path / "c" / "epoch_2.pth", weights_only=False)
    assert not any("_orig_mod" in k for k in ckpt["state_dict"])
    eager = make_runner(tmp_path / "e", load_from=str(tmp_path / "c" / "epoch_2.pth"),
                        **DETERMINISTIC)
    eager._load_or_resume()
    back = make_runner(tmp_path / "b", compile=dict(backend="eager"),
                       load_from=str(tmp_path / "c" / "epoch_2.pth"), **DETERMINISTIC)
    back._load_or_resume()
    for runner in (eager, back):
        for k, v in params_of(runner.model).items():
            assert torch.equal(v, ckpt["state_dict"][k]), k


def test_weights_saved_from_a_torch_compile_wrapper_load_without_its_prefix():
    inner = {"fc.weight": torch.ones(2), "fc.bias": torch.zeros(2)}
    assert model_state_from({"state_dict": {f"_orig_mod.{k}": v for k, v in inner.items()}}) \
        == inner
    assert model_state_from({f"module._orig_mod.{k}": v for k, v in inner.items()}) == inner
    assert model_state_from({f"_orig_mod.module.{k}": v for k, v in inner.items()}) == inner


def test_ema_averages_the_users_module_under_compile(tmp_path):
    runner = make_runner(tmp_path, compile=dict(backend="eager"),
                         custom_hooks=[dict(type="EMAHook", name="ema", momentum=0.5)],
                         **DETERMINISTIC)
    runner.train()
    ema = runner.get_hook("ema")
    trained = params_of(runner.model)
    assert type(ema.ema_model.module).__name__ == "ToyModel"
    averaged = ema.ema_model.module.state_dict()
    assert averaged.keys() == trained.keys()
    assert any(not torch.equal(averaged[k], trained[k]) for k in trained)


@pytest.mark.parametrize("value, key, says", [
    ("yes", "compile", "takes True, False or dict("),
    (dict(mdoe="max-autotune"), "compile.mdoe", "did you mean 'mode'"),
])
def test_a_wrong_compile_value_is_one_line_naming_the_key(tmp_path, value, key, says):
    with pytest.raises(ConfigError) as err:
        make_runner(tmp_path, compile=value, **DETERMINISTIC)
    assert err.value.key == key and says in str(err.value)
