"""Exact resume: a run restarted from any of its checkpoints ends with the uninterrupted run's
weights (torch.equal), sees exactly the remaining batches, and never fetches consumed ones."""
import pytest
import torch

from distributed_runner.core.errors import ConfigError
from tests.toy import assert_state_equal, make_runner, params_of

DATA = dict(train_dataloader=dict(dataset=dict(type="ToyDataset", n=40, with_index=True),
                                  batch_size=4, sampler=dict(type="DefaultSampler", shuffle=True)))
SCHEDULE = [dict(type="LinearLR", start_factor=0.2, by_epoch=False, begin=0, end=8),
            dict(type="CosineAnnealingLR", by_epoch=True, begin=0, end=3, eta_min=0.01,
                 convert_to_iter_based=True)]


def run(work_dir, resume=False, checkpoint=None, **extra):
    cfg = dict(DATA, param_scheduler=SCHEDULE,
               optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.05)),
               default_hooks=dict(checkpoint=checkpoint or dict(type="CheckpointHook",
                                                                interval=7, by_epoch=False,
                                                                save_best="accuracy")))
    cfg.update(extra)
    runner = make_runner(work_dir, resume=resume, **cfg)
    runner.train()
    return runner


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted 3-epoch run (30 iterations) with a checkpoint every 7 iterations."""
    wd = tmp_path_factory.mktemp("reference")
    runner = run(wd)
    return wd, runner


@pytest.mark.parametrize("ckpt", ["iter_7.pth", "iter_14.pth", "iter_28.pth", "iter_21.pth"])
def test_resume_mid_epoch_from_any_checkpoint_is_exact(reference, tmp_path, ckpt):
    ref_dir, ref = reference
    done = int(ckpt[5:-4])
    resumed = run(tmp_path, resume=str(ref_dir / ckpt))
    assert_state_equal(params_of(resumed.model), params_of(ref.model))
    # exactly the batches the uninterrupted run saw after the checkpoint, in the same order ...
    assert resumed.model.seen == ref.model.seen[done * 4:]
    # ... and the consumed ones were never fetched
    assert resumed.train_dataloader.dataset.fetched == (30 - done) * 4
    assert resumed.iter == 30 and resumed.epoch == 3
    ref_lr = ref.optim_wrapper.get_lr()
    assert resumed.optim_wrapper.get_lr() == ref_lr


def test_resume_keeps_best_checkpoint_decisions(reference, tmp_path):
    ref_dir, ref = reference
    resumed = run(tmp_path, resume=str(ref_dir / "iter_14.pth"))
    ref_hook, hook = ref.get_hook("checkpoint"), resumed.get_hook("checkpoint")
    assert hook.best_scores == ref_hook.best_scores
    assert hook.best_files == ref_hook.best_files


def test_resume_true_uses_the_last_checkpoint_pointer(tmp_path):
    epoch_ckpt = dict(type="CheckpointHook", interval=1)
    ref = run(tmp_path / "ref", checkpoint=epoch_ckpt)
    first = run(tmp_path / "run", checkpoint=epoch_ckpt, train_cfg=dict(by_epoch=True,
                                                                        max_epochs=2))
    assert first.epoch == 2
    resumed = run(tmp_path / "run", resume=True, checkpoint=epoch_ckpt)
    assert resumed.model.seen == ref.model.seen[80:]
    assert_state_equal(params_of(resumed.model), params_of(ref.model))


def test_epoch_resume_runs_the_validation_that_was_due(tmp_path):
    """Saved at after_train_epoch, before that epoch's validation: resume validates first."""
    epoch_ckpt = dict(type="CheckpointHook", interval=1, save_best="accuracy")
    ref = run(tmp_path / "ref", checkpoint=epoch_ckpt)
    resumed = run(tmp_path / "run", checkpoint=epoch_ckpt, resume=str(tmp_path / "ref" /
                                                                      "epoch_1.pth"))
    ref_vals = ref.message_hub.get_scalar("val/accuracy").values()
    assert resumed.message_hub.get_scalar("val/accuracy").values() == ref_vals
    assert resumed.get_hook("checkpoint").best_scores == ref.get_hook("checkpoint").best_scores


def test_iteration_based_loop_resume_is_exact(tmp_path):
    iter_cfg = dict(train_cfg=dict(by_epoch=False, max_iters=25, val_interval=10),
                    param_scheduler=[dict(type="LinearLR", start_factor=0.2, by_epoch=False,
                                          begin=0, end=8)],
                    checkpoint=dict(type="CheckpointHook", interval=6, by_epoch=False))
    ref = run(tmp_path / "ref", **iter_cfg)
    resumed = run(tmp_path / "run", resume=str(tmp_path / "ref" / "iter_12.pth"), **iter_cfg)
    assert resumed.model.seen == ref.model.seen[48:]
    assert_state_equal(params_of(resumed.model), params_of(ref.model))


def test_gradient_accumulation_resume_is_exact(tmp_path):
    acc = dict(optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9),
                                  accumulative_counts=3))
    ref = run(tmp_path / "ref", **acc)
    resumed = run(tmp_path / "run", resume=str(tmp_path / "ref" / "iter_14.pth"), **acc)
    assert_state_equal(params_of(resumed.model), params_of(ref.model))


def test_load_from_loads_weights_only(reference, tmp_path):
    ref_dir, _ = reference
    runner = make_runner(tmp_path, load_from=str(ref_dir / "iter_14.pth"),
                         train_cfg=dict(by_epoch=True, max_epochs=1))
    expected = torch.load(ref_dir / "iter_14.pth", weights_only=True)["state_dict"]
    runner.val()
    assert_state_equal(params_of(runner.model), expected)
    assert runner.iter == 0 and runner.epoch == 0  # no training state restored


def test_resume_with_a_weights_file_explains_load_from(tmp_path, reference):
    ref_dir, ref = reference
    torch.save(ref.model.state_dict(), tmp_path / "weights.pth")
    runner = make_runner(tmp_path / "wd", resume=str(tmp_path / "weights.pth"))
    with pytest.raises(ConfigError, match="resume: .* no 'meta'.*use load_from"):
        runner.train()


def test_a_file_that_is_not_a_checkpoint_is_one_line(tmp_path):
    (tmp_path / "junk.pth").write_text("not a checkpoint")
    runner = make_runner(tmp_path / "wd", load_from=str(tmp_path / "junk.pth"))
    with pytest.raises(ConfigError) as err:
        runner.train()
    assert str(err.value).startswith("load_from: ") and "not a loadable checkpoint" in str(err.value)
    with pytest.raises(ConfigError, match="^load_from: .*does not exist"):  # at construction
        make_runner(tmp_path / "wd2", load_from=str(tmp_path / "missing.pth"))


def test_a_run_without_a_seed_resumes_with_the_seed_it_drew(tmp_path, caplog):
    """No ``randomness.seed``: each start draws one, and the epochs' order follows it — a resume
    takes the checkpoint's (as MMEngine's does), or its epoch would visit other samples; a
    config seed that differs from the checkpoint's is named in a warning and loses."""
    straight = run(tmp_path / "straight", randomness=None)
    resumed = run(tmp_path / "resumed", randomness=None,
                  resume=str(tmp_path / "straight" / "iter_14.pth"))
    assert resumed.seed == straight.seed
    assert_state_equal(params_of(straight.model), params_of(resumed.model))
    with caplog.at_level("WARNING"):
        other = run(tmp_path / "other", randomness=dict(seed=straight.seed + 1),
                    resume=str(tmp_path / "straight" / "iter_14.pth"))
    assert other.seed == straight.seed
    assert f"randomness.seed is {straight.seed + 1} but the checkpoint being resumed was " \
           f"seeded {straight.seed}" in caplog.text
    assert_state_equal(params_of(straight.model), params_of(other.model))
