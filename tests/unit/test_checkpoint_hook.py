"""CheckpointHook: the seeds' worked examples, best/last/published checkpoints, file safety."""
import hashlib
import re

import pytest
import torch

from distributed_runner.checkpoint.files import read_pointer
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import METRICS
from distributed_runner.evaluation.evaluator import BaseMetric
from tests.toy import make_runner

NO_VAL = dict(val_dataloader=None, val_evaluator=None, val_cfg=None)
ONE_ITER_PER_EPOCH = dict(train_dataloader=dict(dataset=dict(type="ToyDataset", n=4), batch_size=4))


def files(folder, pattern=r".*\.pth$"):
    return sorted(p.name for p in folder.iterdir() if re.fullmatch(pattern, p.name))


def train(tmp_path, checkpoint, max_epochs=None, train_cfg=None, **extra):
    cfg = dict(NO_VAL, **ONE_ITER_PER_EPOCH)
    cfg.update(extra)
    runner = make_runner(
        tmp_path, train_cfg=train_cfg or dict(by_epoch=True, max_epochs=max_epochs),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", **checkpoint)), **cfg)
    runner.train()
    return runner


def test_seed_interval_5_max_keep_2_over_20_epochs(tmp_path):
    train(tmp_path, dict(interval=5, max_keep_ckpts=2), max_epochs=20)
    assert files(tmp_path) == ["epoch_15.pth", "epoch_20.pth"]


def test_seed_interval_2_save_begin_5_over_10_epochs(tmp_path):
    train(tmp_path, dict(interval=2, save_begin=5), max_epochs=10)
    assert files(tmp_path, r"epoch_\d+\.pth") == ["epoch_5.pth", "epoch_7.pth", "epoch_9.pth"]
    # save_last keeps the final state apart from the schedule, as last.pth
    assert (tmp_path / "last.pth").is_file()
    assert torch.load(tmp_path / "last.pth", weights_only=True)["meta"]["epoch"] == 10


def test_seed_save_begin_5_interval_1_saves_5_to_10(tmp_path):
    train(tmp_path, dict(interval=1, save_begin=5), max_epochs=10)
    assert files(tmp_path, r"epoch_\d+\.pth") == sorted(f"epoch_{i}.pth" for i in range(5, 11))
    assert not (tmp_path / "last.pth").exists()  # epoch_10 already holds the final state


def test_seed_by_iteration_interval_5(tmp_path):
    train(tmp_path, dict(interval=5, by_epoch=False),
          train_cfg=dict(by_epoch=False, max_iters=20, val_interval=100))
    assert files(tmp_path) == ["iter_10.pth", "iter_15.pth", "iter_20.pth", "iter_5.pth"]


def test_by_iteration_saving_inside_epoch_training(tmp_path):
    train(tmp_path, dict(interval=5, by_epoch=False), max_epochs=3,
          train_dataloader=dict(dataset=dict(type="ToyDataset", n=16), batch_size=4))
    assert files(tmp_path, r"iter_\d+\.pth") == ["iter_10.pth", "iter_5.pth"]
    assert (tmp_path / "last.pth").is_file()  # 12 iterations: the final state is not iter_10


def test_last_checkpoint_pointer_and_out_dir(tmp_path):
    train(tmp_path / "wd", dict(interval=2, out_dir=str(tmp_path / "elsewhere")), max_epochs=4)
    out = tmp_path / "elsewhere" / "wd"  # as MMEngine: out_dir/<basename(work_dir)>
    assert files(out) == ["epoch_2.pth", "epoch_4.pth"]
    # relative to the pointer's folder: a moved or copied work_dir still resolves it
    assert (tmp_path / "wd" / "last_checkpoint").read_text() == "../elsewhere/wd/epoch_4.pth"
    assert (out / "last_checkpoint").read_text() == "epoch_4.pth"
    assert read_pointer(tmp_path / "wd") == read_pointer(out) == out / "epoch_4.pth"


@METRICS.register_module(force=True)
class TwoNumbers(BaseMetric):
    """Reports 'first' (rises with the epoch) then 'second' (falls): an ordered dict."""

    calls = 0

    def process(self, data_batch, outputs):
        self.results.append(1)

    def compute(self, results):
        TwoNumbers.calls += 1
        return {"first": float(TwoNumbers.calls % 3), "second": -float(TwoNumbers.calls)}


def val_with(metric):
    return dict(val_dataloader=dict(dataset=dict(type="ToyDataset", n=4), batch_size=4),
                val_evaluator=dict(type=metric), val_cfg=dict())


def test_save_best_auto_uses_the_first_metric(tmp_path):
    TwoNumbers.calls = 0
    runner = make_runner(
        tmp_path, train_cfg=dict(by_epoch=True, max_epochs=5), **ONE_ITER_PER_EPOCH,
        **val_with("TwoNumbers"),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", save_best="auto",
                                           rule="greater")))
    runner.train()
    # first = 1, 2, 0, 1, 2 over epochs 1..5: the best (2) first appears at epoch 2
    assert files(tmp_path, r"best_.*\.pth") == ["best_first_epoch_2.pth"]
    assert runner.get_hook("checkpoint").best_scores == {"first": 2.0}


def test_save_best_several_keys_and_rules(tmp_path):
    TwoNumbers.calls = 0
    make_runner(
        tmp_path, train_cfg=dict(by_epoch=True, max_epochs=4), **ONE_ITER_PER_EPOCH,
        **val_with("TwoNumbers"),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", save_best=["first", "second"],
                                           rule=["greater", "less"]))).train()
    assert files(tmp_path, r"best_.*\.pth") == ["best_first_epoch_2.pth", "best_second_epoch_4.pth"]


def test_seed_published_keys_with_rule_less(tmp_path):
    runner = make_runner(
        tmp_path, train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=1,
                                           save_best="accuracy", rule="less",
                                           published_keys=["meta", "state_dict"])))
    runner.train()
    hook = runner.get_hook("checkpoint")
    best = hook.best_files["accuracy"]
    published = files(tmp_path, r".*-[0-9a-f]{8}\.pth$")
    stems = {p.rsplit("-", 1)[0] for p in published}
    assert stems == {best[:-4], "epoch_3"}  # the best and the last checkpoint
    for name in published:
        ckpt = torch.load(tmp_path / name, weights_only=True)
        assert set(ckpt) == {"meta", "state_dict"}
        digest = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()[:8]
        assert name.endswith(f"-{digest}.pth")
    scores = [r for r in runner.message_hub.get_scalar("val/accuracy").values()]
    assert hook.best_scores["accuracy"] == min(scores)  # rule='less' keeps the lowest


def test_save_best_unknown_metric_names_the_metrics(tmp_path):
    runner = make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=1),
                         default_hooks=dict(checkpoint=dict(type="CheckpointHook",
                                                            save_best="top1")))
    with pytest.raises(ConfigError, match="'top1' is not a validation metric.*accuracy"):
        runner.train()


@pytest.mark.parametrize("args,fragment", [
    (dict(rule="bigger", save_best="accuracy"), "unknown rule"),
    (dict(save_best="weird_metric"), "cannot tell whether a larger"),
    (dict(published_keys=["meta", "weights"]), "unknown checkpoint key 'weights'"),
    (dict(filename_tmpl="ckpt.pth"), "needs a '{}'"),
])
def test_bad_arguments_fail_at_construction(tmp_path, args, fragment):
    with pytest.raises(ConfigError, match=fragment):
        make_runner(tmp_path, default_hooks=dict(checkpoint=dict(type="CheckpointHook", **args)))


def test_checkpoint_contents_load_with_weights_only(tmp_path):
    runner = train(tmp_path, dict(interval=1), max_epochs=2)
    ckpt = torch.load(tmp_path / "epoch_2.pth", weights_only=True)
    assert {"meta", "state_dict", "optimizer", "param_schedulers", "scaler", "message_hub",
            "hooks", "rng", "sampler"} <= set(ckpt)
    meta = ckpt["meta"]
    assert (meta["epoch"], meta["iter"], meta["iter_in_epoch"]) == (2, 2, 0)
    assert meta["seed"] == 0 and meta["world_size"] == 1 and "torch" in meta["versions"]
    assert "checkpoint" in ckpt["hooks"] and len(ckpt["rng"]["ranks"]) == 1
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert runner.find_latest_checkpoint() == tmp_path / "epoch_2.pth"


def test_save_optimizer_false_leaves_it_out(tmp_path):
    train(tmp_path, dict(interval=1, save_optimizer=False), max_epochs=1)
    assert "optimizer" not in torch.load(tmp_path / "epoch_1.pth", weights_only=True)
