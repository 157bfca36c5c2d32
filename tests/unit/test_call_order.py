"""The order of mount points in a train + val + test run, as DESIGN.md §2 specifies it."""
from tests.toy import RecorderHook, make_runner


def expected_train_run(epochs, iters, val_every=1, saves_per_epoch=1, best_saves=()):
    """``saves_per_epoch=None``: a periodic save on the epochs that validate (interval ==
    val_every)."""
    calls = ["before_run", "before_train"]
    for e in range(1, epochs + 1):
        calls.append("before_train_epoch")
        for _ in range(iters):
            calls += ["before_train_iter", "after_train_iter"]
        calls.append("after_train_epoch")
        saves = saves_per_epoch if saves_per_epoch is not None else int(e % val_every == 0)
        # CheckpointHook (VERY_LOW) saves; after_save_checkpoint is our addition to MMEngine's
        calls += ["before_save_checkpoint", "after_save_checkpoint"] * saves
        if e % val_every == 0:
            calls += ["before_val", "before_val_epoch"]
            calls += ["before_val_iter", "after_val_iter"] * 3  # 20 samples, batch 8
            calls.append("after_val_epoch")
            if e in best_saves:
                calls += ["before_save_checkpoint", "after_save_checkpoint"]
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
    accs = runner.message_hub.get_scalar("val/accuracy").values()
    assert len(accs) == 2  # epochs 2 and 4 validate
    best = [2] + ([4] if accs[1] > accs[0] else [])  # the first validation is always a new best
    assert rec.calls == expected_train_run(epochs=4, iters=2, val_every=2, best_saves=best,
                                           saves_per_epoch=None)


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
