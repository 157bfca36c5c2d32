"""MMEngine's Hook forwards the train/val/test epoch and iteration mount points to
``_before_epoch/_after_epoch/_before_iter/_after_iter(..., mode=)``: hooks that override only
those run here too — ours, and MMEngine's own, loaded from its published wheel."""
from collections import Counter

import torch

from hooks import Hook
from tests.published import mmengine_hook
from tests.toy import make_runner

TEN_ITERS, TWO_EPOCHS, VAL_BATCHES = 10, 2, 3  # toy: 40 samples / 4; val 20 / 8


class HelpersOnly(Hook):
    """Overrides MMEngine's four helpers and nothing else."""

    def __init__(self) -> None:
        self.calls: Counter = Counter()

    def _before_epoch(self, runner, mode="train"):
        self.calls["before_epoch", mode] += 1

    def _after_epoch(self, runner, mode="train"):
        self.calls["after_epoch", mode] += 1

    def _before_iter(self, runner, batch_idx, data_batch=None, mode="train"):
        assert data_batch is not None
        self.calls["before_iter", mode] += 1

    def _after_iter(self, runner, batch_idx, data_batch=None, outputs=None, mode="train"):
        assert outputs is not None
        self.calls["after_iter", mode] += 1


def test_a_hook_overriding_only_the_helpers_runs_at_every_stage(tmp_path):
    hook = HelpersOnly()
    runner = make_runner(tmp_path, custom_hooks=[hook],
                         train_cfg=dict(by_epoch=True, max_epochs=TWO_EPOCHS),
                         test_dataloader=dict(dataset=dict(type="ToyDataset", n=20, seed=2),
                                              batch_size=8),
                         test_evaluator=dict(type="Accuracy"), test_cfg=dict())
    runner.train()
    runner.test()
    c = hook.calls
    assert c["before_epoch", "train"] == c["after_epoch", "train"] == TWO_EPOCHS
    assert c["before_iter", "train"] == c["after_iter", "train"] == TWO_EPOCHS * TEN_ITERS
    assert c["before_epoch", "val"] == c["after_epoch", "val"] == TWO_EPOCHS
    assert c["after_iter", "val"] == TWO_EPOCHS * VAL_BATCHES
    assert c["before_iter", "test"] == c["after_iter", "test"] == VAL_BATCHES
    assert c["after_epoch", "test"] == 1
    stages = hook.get_triggered_stages()
    assert "after_train_iter" in stages and "before_test_epoch" in stages
    assert "before_run" not in stages and "after_save_checkpoint" not in stages


def test_overriding_a_mount_point_wins_over_the_helper(tmp_path):
    class Both(HelpersOnly):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            self.calls["own after_train_iter"] += 1

    hook = Both()
    make_runner(tmp_path, custom_hooks=[hook],
                train_cfg=dict(by_epoch=True, max_epochs=1)).train()
    assert hook.calls["own after_train_iter"] == TEN_ITERS
    assert hook.calls["after_iter", "train"] == 0 and hook.calls["after_iter", "val"] == 3


def test_mmengines_published_empty_cache_hook(tmp_path, monkeypatch):
    """mmengine 0.10.7's EmptyCacheHook as published; its CUDA check answers yes and
    torch.cuda.empty_cache counts, so its effect is observable on a CPU machine.
    Rewritten: its Hook and HOOKS imports, and ``from ..device import ...`` (the CUDA check)."""
    module = mmengine_hook("empty_cache_hook.py", {
        "from ..device import is_cuda_available, is_musa_available":
            "is_cuda_available, is_musa_available = (lambda: True), (lambda: False)"})
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    hook = module.EmptyCacheHook(before_epoch=True, after_epoch=True, after_iter=True)
    make_runner(tmp_path, custom_hooks=[hook],
                train_cfg=dict(by_epoch=True, max_epochs=TWO_EPOCHS)).train()
    per_epoch = 2 + TEN_ITERS + 2 + VAL_BATCHES  # train epoch, then its validation
    assert len(emptied) == TWO_EPOCHS * per_epoch


def test_mmengines_published_iter_timer_hook_replaces_ours(tmp_path):
    """mmengine 0.10.7's IterTimerHook as published (its Hook and HOOKS imports rewritten), in
    place of ours: it times every stage through the helpers and keeps the ETA."""
    module = mmengine_hook("iter_timer_hook.py")
    timer = module.IterTimerHook()
    runner = make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=TWO_EPOCHS),
                         default_hooks=dict(timer=timer, checkpoint=None))
    runner.train()
    hub = runner.message_hub
    assert len(hub.get_scalar("train/time")) == TWO_EPOCHS * TEN_ITERS
    assert len(hub.get_scalar("train/data_time")) == TWO_EPOCHS * TEN_ITERS
    assert len(hub.get_scalar("val/time")) == TWO_EPOCHS * VAL_BATCHES
    assert timer.time_sec_tot > 0 and all(t > 0 for t in hub.get_scalar("train/time").values())
    assert hub.get_info("eta") == 0  # its last update: validation's last batch
    records = (tmp_path / "logs" / "scalars.jsonl").read_text()
    assert '"time": ' in records and '"data_time": ' in records


def test_a_subclass_of_our_timer_overriding_after_iter_times_training_too(tmp_path):
    """Downstream timers (mmagic's GenIterTimerHook) subclass IterTimerHook and override
    ``_after_iter``: it runs for training as well, and the ETA is still kept."""
    from hooks import IterTimerHook

    class CountingTimer(IterTimerHook):
        modes: Counter

        def _after_iter(self, runner, batch_idx, data_batch=None, outputs=None, mode="train"):
            self.modes = getattr(self, "modes", Counter())
            self.modes[mode] += 1
            super()._after_iter(runner, batch_idx, data_batch, outputs, mode)

    timer = CountingTimer()
    runner = make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=1),
                         default_hooks=dict(timer=timer, checkpoint=None))
    runner.train()
    assert timer.modes == Counter(train=TEN_ITERS, val=VAL_BATCHES)
    assert len(runner.message_hub.get_scalar("train/time")) == TEN_ITERS
    assert runner.message_hub.get_info("eta") == 0
