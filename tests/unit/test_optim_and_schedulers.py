"""OptimWrapper (accumulation, clipping, AMP) and parameter schedulers (windows, conversion)."""
import math

import pytest
import torch
from torch import nn

from distributed_runner.optim.schedulers import build_param_schedulers
from distributed_runner.optim.wrapper import AmpOptimWrapper, OptimWrapper, build_optim_wrapper
from tests.toy import make_runner


def linear_and_data():
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    return model, x, y


def test_accumulation_equals_one_big_batch():
    model_a, x, y = linear_and_data()
    model_b = nn.Linear(4, 1)
    model_b.load_state_dict(model_a.state_dict())
    big = OptimWrapper(torch.optim.SGD(model_a.parameters(), lr=0.1))
    big.update_params(nn.functional.mse_loss(model_a(x), y))
    acc = OptimWrapper(torch.optim.SGD(model_b.parameters(), lr=0.1), accumulative_counts=2)
    acc.initialize_count_status(0, 2)
    for half in (slice(0, 4), slice(4, 8)):
        with acc.optim_context(model_b):
            loss = nn.functional.mse_loss(model_b(x[half]), y[half])
        acc.update_params(loss)
    for a, b in zip(model_a.parameters(), model_b.parameters()):
        assert torch.allclose(a, b, atol=1e-7)


def test_last_short_window_is_scaled_by_its_length():
    model, x, y = linear_and_data()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=4)
    wrapper.initialize_count_status(0, 6)  # windows: 4, then 2
    factors = []
    for i in range(6):
        factors.append(wrapper._loss_factor())
        steps_before = wrapper.should_update()
        wrapper.update_params(nn.functional.mse_loss(model(x), y))
        assert steps_before == (i in (3, 5))
    assert factors == [4, 4, 4, 4, 2, 2]


def test_clip_grad_bounds_the_norm_and_is_logged(tmp_path):
    runner = make_runner(tmp_path, optim_wrapper=dict(
        optimizer=dict(type="SGD", lr=0.1), clip_grad=dict(max_norm=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=1))
    runner.train()
    norms = runner.message_hub.get_scalar("train/grad_norm").values()
    assert len(norms) == 10 and all(n > 0 for n in norms)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_amp_wrapper_trains_on_cpu(tmp_path, dtype):
    runner = make_runner(tmp_path, optim_wrapper=dict(
        type="AmpOptimWrapper", dtype=dtype, optimizer=dict(type="SGD", lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=1))
    before = {k: v.clone() for k, v in runner.model.state_dict().items()}
    runner.train()
    assert isinstance(runner.optim_wrapper, AmpOptimWrapper)
    assert (runner.optim_wrapper.scaler is not None) == (dtype == "float16")
    changed = [k for k, v in runner.model.state_dict().items() if not torch.equal(v, before[k])]
    assert "fc1.weight" in changed


def test_torch_optimizer_by_name():
    model = nn.Linear(2, 2)
    wrapper = build_optim_wrapper(dict(optimizer=dict(type="AdamW", lr=1e-3)), model)
    assert isinstance(wrapper.optimizer, torch.optim.AdamW)


def lrs_over(schedulers, optimizer, steps, per_epoch=None):
    out = []
    for i in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        for s in schedulers:
            if not s.by_epoch:
                s.step()
        if per_epoch and (i + 1) % per_epoch == 0:
            for s in schedulers:
                if s.by_epoch:
                    s.step()
    return out


def test_warmup_then_cosine_chain_by_iteration():
    opt = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    scheds = build_param_schedulers(
        [dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=4),
         dict(type="CosineAnnealingLR", by_epoch=False, begin=4, end=12, eta_min=0.0)],
        opt, by_epoch_training=True, epoch_length=4, max_epochs=3, max_iters=12)
    lrs = lrs_over(scheds, opt, 12)
    assert lrs[:5] == pytest.approx([0.1, 0.325, 0.55, 0.775, 1.0])
    cosine = [0.5 * (1 + math.cos(math.pi * t / 8)) for t in range(8)]
    assert lrs[4:] == pytest.approx(cosine)


def test_convert_to_iter_based_matches_an_iteration_schedule():
    opt_a = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    converted = build_param_schedulers(
        dict(type="CosineAnnealingLR", by_epoch=True, begin=0, end=3, convert_to_iter_based=True),
        opt_a, by_epoch_training=True, epoch_length=5, max_epochs=3, max_iters=15)
    assert not converted[0].by_epoch and converted[0].end == 15
    opt_b = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=1.0)
    direct = build_param_schedulers(
        dict(type="CosineAnnealingLR", by_epoch=False, begin=0, end=15), opt_b,
        by_epoch_training=True, epoch_length=5, max_epochs=3, max_iters=15)
    assert lrs_over(converted, opt_a, 15) == pytest.approx(lrs_over(direct, opt_b, 15))


def test_epoch_scheduler_steps_once_per_epoch(tmp_path):
    runner = make_runner(tmp_path, param_scheduler=dict(type="MultiStepLR", milestones=[1, 2],
                                                        gamma=0.1),
                         train_cfg=dict(by_epoch=True, max_epochs=3))
    runner.train()
    lrs = runner.message_hub.get_scalar("train/lr").values()
    assert lrs[:10] == pytest.approx([0.1] * 10)
    assert lrs[10:20] == pytest.approx([0.01] * 10) and lrs[20:] == pytest.approx([0.001] * 10)
