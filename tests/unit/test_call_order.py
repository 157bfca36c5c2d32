"""The order of mount points in a train + val + test run, as DESIGN.md §2 specifies it."""
from tests.toy import RecorderHook, make_runner


def expected_train_run(epochs, iters, val_every=1, saves_per_epoch=1, best_saves=()):
    calls = ["before_run", "before_train"]
    for e in range(1, epochs + 1):
        calls.append("before_train_epoch")
        for _ in range(iters):
            calls += ["before_train_iter", "after_train_iter"]
        calls.append("after_train_epoch")
        calls += ["before_save_checkpoint"] * saves_per_epoch  # CheckpointHook (VERY_LOW) saves
        if e % val_every == 0:
            calls += ["before_val", "before_val_epoch"]
            calls += ["before_val_iter", "after_val_iter"] * 3  # 20 samples, batch 8
            calls.append("after_val_epoch")
            if e in best_saves:
                calls.append("before_save_checkpoint")
            calls.append("after_val")
    calls += ["after_train", "after_run"]
    return calls


def test_train_val_test_order(tmp_path):
    rec = RecorderHook()
    runner = make_runner(
        tmp_path, train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1),
        train_dataloader=dict(dataset=dict(type="ToyDataset", n=8), batch_size=4),
        test_dataloader=dict(dataset=dict(type="ToyDataset", n=20, seed=1), batch_size=8,
                             sampler=dict(type="DefaultSampler", shuffle=False)),
        test_evaluator=dict(type="Accuracy"), test_cfg=dict(),
        custom_hooks=[rec])
    runner.train()
    assert rec.calls == expected_train_run(epochs=2, iters=2)
    rec.calls.clear()
    runner.test()
    assert rec.calls == (["before_run", "before_test", "before_test_epoch"]
                         + ["before_test_iter", "after_test_iter"] * 3
                         + ["after_test_epoch", "after_test", "after_run"])


def test_save_best_and_val_interval_in_the_order(tmp_path):
    rec = RecorderHook()
    runner = make_runner(
        tmp_path, train_cfg=dict(by_epoch=True, max_epochs=4, val_interval=2),
        train_dataloader=dict(dataset=dict(type="ToyDataset", n=8), batch_size=4),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=2,
                                           save_best="accuracy")),
        custom_hooks=[rec])
    runner.train()
    calls = rec.calls
    # epochs 2 and 4 validate; the first validation is always a new best
    assert calls.count("before_val") == 2
    assert calls.count("before_save_checkpoint") >= 3  # epoch 2, best@2, epoch 4
    assert calls[:2] == ["before_run", "before_train"] and calls[-2:] == ["after_train", "after_run"]


def test_after_train_and_after_run_run_when_training_raises(tmp_path):
    from hooks import Hook

    class Explode(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            if runner.iter == 3:
                raise RuntimeError("boom")

    rec = RecorderHook()
    runner = make_runner(tmp_path, custom_hooks=[Explode(), rec])
    try:
        runner.train()
    except RuntimeError as e:
        assert str(e) == "boom"
    else:
        raise AssertionError("training should have raised")
    assert rec.calls[-2:] == ["after_train", "after_run"]
    # a failed run does not leave a 'last' checkpoint of its broken state
    assert not (tmp_path / "last.pth").exists()


def test_load_from_fires_after_load_checkpoint_after_before_run(tmp_path):
    first = make_runner(tmp_path / "a", train_cfg=dict(by_epoch=True, max_epochs=1))
    first.train()
    rec = RecorderHook()
    runner = make_runner(tmp_path / "b", load_from=str(tmp_path / "a" / "epoch_1.pth"),
                         train_cfg=dict(by_epoch=True, max_epochs=1), custom_hooks=[rec])
    runner.val()
    assert rec.calls[:3] == ["before_run", "after_load_checkpoint", "before_val"]
