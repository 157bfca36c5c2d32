"""``CheckpointHook(async_save=True)``: the same checkpoints as a synchronous run, written in
the background; committed (pointer, retention) only once written; exact resume; a failed
background write is one line at the commit and leaves the previous checkpoint in charge."""
import time

import pytest
import torch

from distributed_runner.checkpoint.files import read_pointer
from distributed_runner.core.errors import CheckpointWriteError
from hooks import Hook
from tests.toy import make_runner

NO_VAL = dict(val_dataloader=None, val_evaluator=None, val_cfg=None)
ITERS = dict(train_cfg=dict(by_epoch=False, max_iters=9))


def checkpoint_cfg(async_save, **extra):
    return dict(default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=3,
                                                   by_epoch=False, max_keep_ckpts=2,
                                                   async_save=async_save, **extra)))


def run(work_dir, async_save, hooks=(), **extra):
    runner = make_runner(work_dir, custom_hooks=list(hooks), **NO_VAL, **ITERS,
                         **checkpoint_cfg(async_save), **extra)
    runner.train()
    return runner


def load(path):
    return torch.load(path, weights_only=False)


def test_async_saves_write_what_sync_saves_write(tmp_path):
    run(tmp_path / "sync", False)
    run(tmp_path / "async", True)
    names = sorted(p.name for p in (tmp_path / "sync").glob("*.pth"))
    assert names == ["iter_6.pth", "iter_9.pth"]  # max_keep_ckpts=2 removed iter_3 on commit
    assert sorted(p.name for p in (tmp_path / "async").glob("*.pth")) == names
    assert read_pointer(tmp_path / "async").name == "iter_9.pth"
    for name in names:
        a, b = load(tmp_path / "sync" / name), load(tmp_path / "async" / name)
        assert b["meta"]["async_save"] is True and b["meta"]["iter"] == a["meta"]["iter"]
        for part in ("state_dict", "rng", "sampler"):
            assert repr(a[part]) == repr(b[part]), f"{name} {part}"
        for k, v in a["optimizer"]["state"].items():
            assert all(torch.equal(v[s], b["optimizer"]["state"][k][s]) for s in v)


def test_resume_from_an_async_checkpoint_is_exact(tmp_path):
    straight = run(tmp_path / "a", True)
    resumed = run(tmp_path / "b", True, resume=str(tmp_path / "a" / "iter_6.pth"))
    for k, v in straight.model.state_dict().items():
        assert torch.equal(v, resumed.model.state_dict()[k]), k


class SlowIteration(Hook):
    """After iteration 4, sleep (the background write finishes meanwhile); after iteration 5,
    note what last_checkpoint names. LOWEST: after CheckpointHook's check for a finished write."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.pointer_at_5 = None

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == 4:
            time.sleep(0.5)
        if runner.iter + 1 == 5:
            self.pointer_at_5 = read_pointer(runner.work_dir)


def test_a_finished_background_write_commits_without_waiting_for_the_next_save(tmp_path):
    probe = SlowIteration()
    run(tmp_path, True, hooks=[probe])
    assert probe.pointer_at_5 is not None and probe.pointer_at_5.name == "iter_3.pth"


def test_a_failed_background_write_is_one_line_and_the_previous_checkpoint_stays(
        tmp_path, monkeypatch):
    import distributed_runner.checkpoint.writer as writer
    real = writer.atomic_save

    def failing(obj, path):
        if path.name == "iter_6.pth":
            raise CheckpointWriteError("no space left on device writing iter_6.pth")
        return real(obj, path)

    monkeypatch.setattr(writer, "atomic_save", failing)
    with pytest.raises(CheckpointWriteError) as err:
        run(tmp_path, True)
    assert "iter_6.pth" in str(err.value) and "\n" not in str(err.value)
    assert read_pointer(tmp_path).name == "iter_3.pth"
    assert not (tmp_path / "iter_6.pth").exists()
