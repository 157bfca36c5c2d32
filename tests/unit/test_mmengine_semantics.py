"""Loop and hook rules that follow MMEngine's (issue: MMEngine and iMIX parity)."""
import torch

from hooks import Hook
from tests.toy import make_runner, params_of


class ValCounter(Hook):
    def __init__(self) -> None:
        self.at: list[tuple[int, int]] = []

    def after_val_epoch(self, runner, metrics=None) -> None:
        self.at.append((runner.epoch, runner.iter))


def test_the_final_model_is_validated_when_max_is_not_a_multiple_of_val_interval(tmp_path):
    seen = ValCounter()
    runner = make_runner(tmp_path / "epochs", custom_hooks=[seen],
                         train_cfg=dict(by_epoch=True, max_epochs=3, val_interval=2),
                         default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=-1,
                                                            save_best="accuracy", rule="greater")))
    runner.train()
    assert seen.at == [(2, 20), (3, 30)]  # after epochs 2 and 3 (the last)
    accs = runner.message_hub.get_scalar("val/accuracy").values()  # epochs 2 and 3
    hook = runner.get_hook("checkpoint")
    assert len(accs) == 2 and hook.best_scores["accuracy"] == max(accs)  # 3 was a candidate
    best_epoch = 3 if accs[1] > accs[0] else 2
    assert f"epoch_{best_epoch}" in str(hook.best_files["accuracy"])

    by_iter = ValCounter()
    make_runner(tmp_path / "iters", custom_hooks=[by_iter],
                train_cfg=dict(by_epoch=False, max_iters=25, val_interval=10),
                default_hooks=dict(checkpoint=None)).train()
    assert [i for _, i in by_iter.at] == [10, 20, 25]


def test_early_stopping_decides_after_every_other_hook_saw_the_metrics(tmp_path):
    runner = make_runner(tmp_path, custom_hooks=[
        dict(type="EarlyStoppingHook", monitor="accuracy", patience=1)])
    order = [e.name for e in runner._hooks.entries]
    assert order[-1] == "early_stopping" and order.index("checkpoint") < order.index(
        "early_stopping")


MMCV1_CONFIG = """
_base_ = []
model = dict(type='ToyModel')
data = dict(samples_per_gpu=4, workers_per_gpu=0, train=dict(type='ToyDataset', n=40))
optimizer = dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=0.0001)
optimizer_config = dict(grad_clip=None)
lr_config = dict(policy='step', warmup='linear', warmup_iters=500, step=[8, 11])
runner = dict(type='EpochBasedRunner', max_epochs=12)
checkpoint_config = dict(interval=1)
log_config = dict(interval=50, hooks=[dict(type='TextLoggerHook')])
evaluation = dict(interval=1, metric='bbox')
resume_from = None
workflow = [('train', 1)]
"""


def test_an_mmcv1_config_is_refused_with_what_replaced_each_key(tmp_path):
    """An MMDetection 2.x-style config: each old key would be ignored, its feature silently off;
    the error names the key and its MMEngine replacement (then the next one, once fixed)."""
    import pytest

    from distributed_runner.core.config import Config
    from distributed_runner.core.errors import ConfigError
    from distributed_runner.engine.config_check import MMCV1_KEYS
    from distributed_runner.engine.runner import Runner

    path = tmp_path / "faster_rcnn_r50_fpn_1x.py"
    path.write_text(MMCV1_CONFIG)
    cfg = dict(Config.fromfile(str(path)))
    cfg.pop("_base_", None)
    cfg["work_dir"] = str(tmp_path / "w")
    refused = []
    for _ in range(len(MMCV1_KEYS) + 1):
        try:
            Runner.from_cfg(dict(cfg))
        except ConfigError as err:
            key = str(err).split(":", 1)[0]
            assert "MMCV 1.x key" in str(err) and MMCV1_KEYS[key] in str(err)
            refused.append(key)
            cfg.pop(key)
            continue
        break
    assert set(refused) == {"data", "optimizer", "optimizer_config", "lr_config", "runner",
                            "checkpoint_config", "log_config", "evaluation", "resume_from",
                            "workflow"}
    # MMEngine's own layout keeps helper variables with some of these names: left alone
    ok = dict(work_dir=str(tmp_path / "ok"), model=dict(type="ToyModel"),
              optimizer=dict(type="SGD", lr=0.1), data="/datasets/coco", runner="local",
              train_dataloader=dict(dataset=dict(type="ToyDataset", n=8), batch_size=4),
              train_cfg=dict(by_epoch=True, max_epochs=1))
    ok["optim_wrapper"] = dict(optimizer=ok["optimizer"])
    Runner.from_cfg(ok)
    with pytest.raises(ConfigError, match="^optimizer: is an MMCV 1.x key"):
        Runner.from_cfg({k: v for k, v in ok.items() if k != "optim_wrapper"})


def test_after_load_checkpoint_runs_before_anything_loads_and_may_rewrite_the_checkpoint(
        tmp_path):
    """MMEngine's order: the hook sees the checkpoint first (``runner.loading_for`` says why it
    is loaded), and what it changes is what the runner loads."""
    make_runner(tmp_path / "t").train()
    seen = []

    class ZeroHead(Hook):
        def after_load_checkpoint(self, runner, checkpoint):
            seen.append((runner.loading_for, runner.iter))
            checkpoint["state_dict"]["fc2.bias"] = torch.zeros(2)

    loaded = make_runner(tmp_path / "l", load_from=str(tmp_path / "t" / "epoch_3.pth"),
                         custom_hooks=[ZeroHead()])
    loaded.val()
    resumed = make_runner(tmp_path / "r", resume=str(tmp_path / "t" / "epoch_2.pth"),
                          custom_hooks=[ZeroHead()])
    resumed.train()
    assert seen == [("load_from", 0), ("resume", 0)]  # before the position was restored
    assert torch.equal(params_of(loaded.model)["fc2.bias"], torch.zeros(2))
    assert loaded.loading_for is None and resumed.iter == 30
