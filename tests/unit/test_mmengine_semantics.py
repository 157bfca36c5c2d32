"""Loop and hook rules that follow MMEngine's (issue: MMEngine and iMIX parity)."""
from hooks import Hook
from tests.toy import make_runner


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
