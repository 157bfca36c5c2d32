"""The on-demand hooks: EMA, EarlyStopping, EmptyCache, Profiler, CheckInvalidLoss,
AutogradAnomalyDetect, PrepareTTA (+ TTAModel) and Visualization — each in-process."""
import json

import numpy as np
import pytest
import torch
from torch import nn

import tests.hook_probes  # noqa: F401
from distributed_runner import Runner
from distributed_runner.core.config import Config
from distributed_runner.core.errors import ConfigError
from distributed_runner.model.averaged import (
    ExponentialMovingAverage,
    MomentumAnnealingEMA,
    StochasticWeightAverage,
)
from distributed_runner.model.tta import TTAModel
from hooks import Hook
from tests.toy import ToyModel, assert_state_equal, base_cfg, make_runner, params_of


def _ema_state(runner):
    return {k: v.clone() for k, v in runner.get_hook("ema").ema_model.state_dict().items()}


# -- EMAHook -------------------------------------------------------------------------------------
def test_average_rules():
    torch.manual_seed(0)
    src = nn.Linear(2, 2)
    snapshots = []
    ema, swa = ExponentialMovingAverage(src, momentum=0.25), StochasticWeightAverage(src)
    anneal = MomentumAnnealingEMA(src, momentum=0.01, gamma=2)
    for _ in range(4):
        with torch.no_grad():
            src.weight.add_(torch.randn_like(src.weight))
        snapshots.append(src.weight.detach().clone())
        for avg in (ema, swa, anneal):
            avg.update_parameters(src)
    expected = snapshots[0]
    for s in snapshots[1:]:
        expected = 0.75 * expected + 0.25 * s
    assert torch.allclose(ema.module.weight, expected)
    assert torch.allclose(swa.module.weight, torch.stack(snapshots).mean(0))
    expected = snapshots[0]
    for step, s in enumerate(snapshots[1:], start=1):
        m = max(0.01, 2 / (2 + step))
        expected = (1 - m) * expected + m * s
    assert torch.allclose(anneal.module.weight, expected)
    assert ema.steps == 4 and not ema.module.weight.requires_grad


def test_ema_evaluates_with_the_average_and_never_changes_training(tmp_path):
    seen = {}

    class Probe(Hook):
        priority = "LOWEST"

        def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            seen["val"] = params_of(runner.model)

    plain = make_runner(tmp_path / "plain")
    plain.train()
    runner = make_runner(tmp_path / "ema", custom_hooks=[dict(type="EMAHook", momentum=0.1)])
    runner._hooks.register(Probe(), "probe")
    runner.train()
    assert_state_equal(params_of(runner.model), params_of(plain.model))  # training unchanged
    averaged = runner.get_hook("ema").ema_model.module.state_dict()
    for name, _ in runner.model.named_parameters():
        assert torch.equal(seen["val"][name], averaged[name])  # validation saw the average
        assert not torch.equal(averaged[name], runner.model.state_dict()[name])
    ckpt = torch.load(tmp_path / "ema" / "epoch_3.pth", weights_only=True)
    assert int(ckpt["ema_state_dict"]["steps"]) == 30
    # MMEngine's layout: state_dict holds the average (what is deployed), ema_state_dict the
    # training weights
    assert ckpt["meta"]["ema_in_state_dict"] is True
    assert_state_equal(ckpt["state_dict"], averaged)
    assert_state_equal({k[len("module."):]: v for k, v in ckpt["ema_state_dict"].items()
                        if k != "steps"}, params_of(runner.model))
    runner.val()  # a later val()/test() on the same runner keeps the average
    assert runner.get_hook("ema").ema_model.steps == 30
    for name, _ in runner.model.named_parameters():
        assert torch.equal(seen["val"][name], averaged[name])


def test_ema_resume_continues_the_average_exactly(tmp_path):
    hooks = [dict(type="EMAHook", ema_type="MomentumAnnealingEMA", momentum=0.05,
                  update_buffers=True)]
    full = make_runner(tmp_path / "full", custom_hooks=hooks)
    full.train()
    resumed = make_runner(tmp_path / "again", custom_hooks=hooks,
                          resume=str(tmp_path / "full" / "epoch_1.pth"))
    resumed.train()
    assert_state_equal(_ema_state(resumed), _ema_state(full))
    assert_state_equal(params_of(resumed.model), params_of(full.model))


def test_ema_begin_epoch_and_begin_iter(tmp_path):
    # MMEngine's rule, counting from 1: begin_epoch=2 averages from the second epoch on
    late = make_runner(tmp_path / "a", custom_hooks=[dict(type="EMAHook", begin_epoch=2)])
    late.train()
    assert late.get_hook("ema").ema_model.steps == 20
    last = make_runner(tmp_path / "c", custom_hooks=[dict(type="EMAHook", begin_iter=30)])
    last.train()
    assert last.get_hook("ema").ema_model.steps == 1  # the 30th and last iteration
    with pytest.raises(ConfigError, match=r"custom_hooks\[0\].begin_iter: 31 is after the end "
                                          r"of training \(30\)"):  # MMEngine refuses it too
        make_runner(tmp_path / "b", custom_hooks=[dict(type="EMAHook", begin_iter=31)]).train()
    never = make_runner(tmp_path / "d", custom_hooks=[dict(type="EMAHook", begin_epoch=3)],
                        train_cfg=dict(by_epoch=True, max_epochs=2))
    with pytest.raises(ConfigError, match="begin_epoch: 3 is after the end of training"):
        never.train()
    with pytest.raises(ConfigError, match="begin_iter or begin_epoch, not both"):
        make_runner(tmp_path, custom_hooks=[dict(type="EMAHook", begin_iter=1, begin_epoch=1)])


def test_ema_config_mistakes_fail_at_registration(tmp_path):
    with pytest.raises(ConfigError, match="ema_type.type: unknown model 'ExponentialMovingAvg'.*"
                                          "ExponentialMovingAverage"):
        make_runner(tmp_path, custom_hooks=[dict(type="EMAHook",
                                                 ema_type="ExponentialMovingAvg")])
    with pytest.raises(ConfigError, match="momentun"):
        make_runner(tmp_path, custom_hooks=[dict(type="EMAHook", momentun=0.1)])


def test_ema_load_from_and_strict_load(tmp_path):
    """As MMEngine: ``load_from`` puts the checkpoint's state_dict (the average) in the model and
    starts the average from it; resuming without an ema_state_dict is an error only with
    ``strict_load``."""
    trained = make_runner(tmp_path / "t", custom_hooks=[dict(type="EMAHook", momentum=0.2)])
    trained.train()
    average = trained.get_hook("ema").ema_model.module.state_dict()
    tester = make_runner(tmp_path / "u", load_from=str(tmp_path / "t" / "epoch_3.pth"),
                         custom_hooks=[dict(type="EMAHook", momentum=0.2)])
    tester.val()
    assert_state_equal(params_of(tester.model), average)
    assert_state_equal(tester.get_hook("ema").ema_model.module.state_dict(), average)
    plain = make_runner(tmp_path / "p")
    plain.train()
    hooks = [dict(type="EMAHook", momentum=0.2, strict_load=True)]
    with pytest.raises(ConfigError, match="no ema_state_dict"):
        make_runner(tmp_path / "v", custom_hooks=hooks,
                    resume=str(tmp_path / "p" / "epoch_1.pth")).train()
    hooks[0]["strict_load"] = False  # the average starts from the resumed weights
    lenient = make_runner(tmp_path / "w", custom_hooks=hooks,
                          resume=str(tmp_path / "p" / "epoch_1.pth"))
    lenient.train()
    assert lenient.get_hook("ema").ema_model.steps == 20


# -- EarlyStoppingHook ---------------------------------------------------------------------------
def _early(tmp_path, values, max_epochs=6, start=0, **hook):
    return make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
                       val_evaluator=dict(type="SeqMetric", values=values, start=start),
                       custom_hooks=[dict(type="EarlyStoppingHook", monitor="score",
                                          rule="greater", **hook)])


def test_early_stopping_after_patience_with_reason(tmp_path):
    runner = _early(tmp_path, [0.5, 0.7, 0.74, 0.73, 0.9, 0.9], patience=2, min_delta=0.05)
    runner.train()
    assert runner.iter == 40  # 0.74 and 0.73 are within min_delta of 0.7: stop after epoch 4
    (it, kind, reasons), = runner.requests.log
    assert (it, kind) == (40, "stop") and "not improved by more than 0.05 for 2" in reasons[0]


def test_early_stopping_threshold_and_non_finite(tmp_path):
    runner = _early(tmp_path / "a", [0.5, 0.95, 0.99], stopping_threshold=0.9)
    runner.train()
    assert runner.iter == 20 and "stopping_threshold" in runner.requests.log[0][2][0]
    runner = _early(tmp_path / "b", [0.5, float("nan"), 0.9])
    runner.train()
    assert runner.iter == 20 and "score is nan" in runner.requests.log[0][2][0]


def test_early_stopping_patience_survives_resume(tmp_path):
    values = [0.5, 0.6, 0.6, 0.6, 0.6, 0.6]
    first = _early(tmp_path, values, max_epochs=3, patience=2, min_delta=0.01)
    first.train()
    assert first.get_hook("early_stopping").state_dict() == {"best_score": 0.6, "wait_count": 1}
    again = make_runner(
        tmp_path, resume=True, train_cfg=dict(by_epoch=True, max_epochs=6),
        val_evaluator=dict(type="SeqMetric", values=values, start=3),
        custom_hooks=[dict(type="EarlyStoppingHook", monitor="score", rule="greater",
                           patience=2, min_delta=0.01)])
    again.train()
    assert again.iter == 40  # one more validation without improvement was enough


def test_early_stopping_monitor_and_rule_checks(tmp_path, caplog):
    with pytest.raises(ConfigError, match="set rule='greater' or rule='less'"):
        make_runner(tmp_path, custom_hooks=[dict(type="EarlyStoppingHook", monitor="score")])
    assert make_runner(tmp_path, custom_hooks=[dict(type="EarlyStoppingHook",
                                                    monitor="val_loss")]) \
        .get_hook("early_stopping").rule == "less"
    # Accuracy declares its names: a monitor it does not report fails before training
    for strict in (True, False):
        runner = make_runner(tmp_path / f"s{strict}", custom_hooks=[dict(
            type="EarlyStoppingHook", monitor="acc", strict=strict)])
        with pytest.raises(ConfigError, match="'acc' is not a validation metric.*accuracy"):
            runner.train()
        assert runner.iter == 0
    # a metric that does not declare them: found at the first validation; strict=False warns
    lenient = make_runner(tmp_path / "l", val_evaluator=dict(type="SeqMetric", values=[1.0]),
                          custom_hooks=[dict(type="EarlyStoppingHook", monitor="acc")])
    lenient.train()
    assert lenient.iter == 30


# -- EmptyCacheHook, AutogradAnomalyDetectHook, CheckInvalidLossHook -----------------------------
def test_empty_cache_moments(tmp_path):
    default = make_runner(tmp_path / "a", custom_hooks=[dict(type="EmptyCacheHook")])
    default.train()
    assert default.get_hook("empty_cache").emptied == 6  # after 3 train + 3 val epochs
    every = make_runner(tmp_path / "b", custom_hooks=[dict(
        type="EmptyCacheHook", before_epoch=True, after_epoch=False, after_iter=True)])
    every.train()
    assert every.get_hook("empty_cache").emptied == 6 + 30 + 9  # epochs + train + val iters


def test_autograd_anomaly_detection_is_on_during_training_only(tmp_path):
    seen = []

    class Probe(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            seen.append(torch.is_anomaly_enabled())

    runner = make_runner(tmp_path, custom_hooks=[dict(type="AutogradAnomalyDetectHook")],
                         train_cfg=dict(by_epoch=True, max_epochs=1))
    runner._hooks.register(Probe(), "probe")
    runner.train()
    assert seen and all(seen) and not torch.is_anomaly_enabled()


def test_shipped_check_invalid_loss_hook(tmp_path):
    runner = make_runner(tmp_path, model=dict(type="NanModel", nan_at=[10]),
                         custom_hooks=[dict(type="CheckInvalidLossHook", interval=5)])
    with pytest.raises(FloatingPointError, match="loss became infinite or NaN at iteration 10"):
        runner.train()
    assert runner.get_hook("check_invalid_loss").every.every == 5


# -- ProfilerHook --------------------------------------------------------------------------------
def test_profiler_writes_tensorboard_and_chrome_traces_and_logs_the_table(tmp_path):
    runner = make_runner(tmp_path, custom_hooks=[dict(
        type="ProfilerHook", by_epoch=False, profile_times=3, on_trace_ready=dict(type="tb_trace"),
        json_trace_path="traces/run_{rank}.json", record_shapes=True)])
    runner.train()
    hook = runner.get_hook("profiler")
    traces = list((tmp_path / "tf_tracing_logs").glob("rank0*.pt.trace.json"))
    assert len(traces) == 1 and "traceEvents" in json.loads(traces[0].read_text())
    assert "traceEvents" in json.loads((tmp_path / "traces" / "run_0.json").read_text())
    assert "aten::addmm" in hook.table and "Self CPU" in hook.table
    assert hook.profiler is None  # stopped after 3 iterations


def test_profiler_schedule_and_config_checks(tmp_path):
    runner = make_runner(tmp_path, custom_hooks=[dict(
        type="ProfilerHook", by_epoch=True, profile_times=2,
        schedule=dict(wait=0, warmup=1, active=1), on_trace_ready=dict(type="tb_trace"))])
    runner.train()
    assert len(list((tmp_path / "tf_tracing_logs").glob("*.json"))) == 1
    with pytest.raises(ConfigError, match="on_trace_ready.type: use 'tb_trace' or 'log_trace'"):
        make_runner(tmp_path, custom_hooks=[dict(type="ProfilerHook",
                                                 on_trace_ready=dict(type="tensorboard"))])


# -- PrepareTTAHook and TTAModel -----------------------------------------------------------------
def test_tta_model_merges_views():
    torch.manual_seed(0)
    model = ToyModel().eval()
    x = torch.randn(6, 4)
    flip = torch.flip(x, [-1])
    with torch.no_grad():
        mean = TTAModel(model, ["Identity", dict(type="Flip", dims=[-1])])(inputs=x)
        assert torch.allclose(mean, (model(x) + model(flip)) / 2)
        soft = TTAModel(model, ["Identity", dict(type="Flip")], merge="softmax_mean")(x)
        assert torch.allclose(soft, (model(x).softmax(-1) + model(flip).softmax(-1)) / 2)
        vote = TTAModel(model, ["Identity", "Identity", dict(type="Flip")], merge="vote")(x)
        assert torch.equal(vote.argmax(-1), model(x).argmax(-1)) and vote.sum(-1).eq(3).all()
        assert TTAModel(model)(inputs=x, labels=torch.zeros(6, dtype=torch.long),
                               mode="loss").keys() == {"loss", "acc"}  # training passes through
    with pytest.raises(ConfigError, match="tta_cfg.merge: unknown merge 'max'"):
        TTAModel(model, merge="max")


def test_prepare_tta_hook_wraps_the_test_model_and_unwraps_it(tmp_path):
    calls = []
    cfg = dict(test_dataloader=base_cfg(tmp_path)["val_dataloader"],
               test_evaluator=dict(type="Accuracy"), test_cfg=dict(),
               custom_hooks=[dict(type="PrepareTTAHook", tta_cfg=dict(
                   transforms=["Identity", dict(type="Flip", dims=[-1])]))])
    runner = make_runner(tmp_path, **cfg)
    original = runner.wrapped_model
    runner.model.register_forward_hook(lambda m, i, o: calls.append(len(o)))
    metrics = runner.test()
    assert calls == [8, 8, 8, 8, 4, 4]  # 3 batches, 2 views each
    assert runner.wrapped_model is original and "accuracy" in metrics
    with pytest.raises(ConfigError, match="tta_cfg.transform: TTAModel has no argument "
                                          "'transform' \\(did you mean 'transforms'"):
        make_runner(tmp_path, custom_hooks=[dict(type="PrepareTTAHook",
                                                 tta_cfg=dict(transform=[]))])


# -- VisualizationHook ---------------------------------------------------------------------------
def test_visualization_writes_png_and_tensorboard_images(tmp_path):
    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = Config.fromfile("configs/digits_cnn.py")
    cfg.work_dir = str(tmp_path)
    cfg.run_name = "."  # the test's folder is the run's
    cfg.train_cfg.max_epochs = 1
    cfg.param_scheduler = None
    cfg.log_level = "WARNING"
    cfg.default_hooks = dict(logger=dict(type="LoggerHook", interval=20,
                                         sinks=["jsonl", "tensorboard"]),
                             checkpoint=dict(type="CheckpointHook", interval=-1))
    cfg.custom_hooks = [dict(type="VisualizationHook", max_images=12)]
    runner = Runner.from_cfg(cfg)
    runner.train()
    runner.test()
    hook = runner.get_hook("visualization")
    assert [p.name for p in hook.written] == [f"val_iter_{runner.iter}.png",
                                              f"test_iter_{runner.iter}.png"]
    image = np.asarray(Image.open(hook.written[0]))
    assert image.ndim == 3 and image.shape[2] == 3 and image.shape[1] > 8 * 32
    events = EventAccumulator(str(tmp_path / "logs" / "tensorboard"),
                              size_guidance={"images": 0}).Reload()
    assert "val/predictions" in events.Tags()["images"]
