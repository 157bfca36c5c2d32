"""A PBT fork is exact: a trial that continues another trial's run from its checkpoint with its own
learning rate ends with the very weights of the donor's run continued from there with its rate
scaled the same way — through the trial's config alone, as a trial builds it (no Ray)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from distributed_runner.checkpoint.files import checksum_path, load_file
from distributed_runner.core.config import Config
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.runner import Runner
from distributed_runner.tune.trial_config import trial_config
from hooks import Hook
from hooks.non_finite_loss_hook import scale_learning_rate

ROOT = Path(__file__).resolve().parents[2]
LR = "optim_wrapper.optimizer.lr"
K = 1  # the fork takes the donor's checkpoint after this epoch


@HOOKS.register_module(force=True)
class ScaleLrAtEpochForTest(Hook):
    """The reference: the donor's own run, its learning rate scaled by ``factor`` when epoch
    ``epoch`` starts (after the validation that follows the checkpoint the fork takes)."""

    def __init__(self, epoch: int, factor: float) -> None:
        self.epoch, self.factor = epoch, factor

    def before_train_epoch(self, runner) -> None:
        if runner.epoch == self.epoch:
            scale_learning_rate(runner, self.factor)


def _base() -> Config:
    cfg = Config.fromfile(
        ROOT / "configs" / "digits_tune.py",
        cfg_options={"train_cfg.max_epochs": 3, "default_hooks.checkpoint.max_keep_ckpts": -1},
    )
    return cfg


def _train(cfg: dict) -> Runner:
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner


def test_a_fork_with_half_the_lr_equals_the_donor_continued_with_its_lr_halved(tmp_path):
    base = _base()
    lr = float(base["optim_wrapper"]["optimizer"]["lr"])
    values = {LR: lr, "model.width": 8}
    donor_dir = tmp_path / "trials" / "donor"
    reference = trial_config(base, values, "donor", str(donor_dir))
    reference["custom_hooks"] = [{"type": "ScaleLrAtEpochForTest", "epoch": K, "factor": 0.5}]
    donor = _train(reference)
    donor_file = donor_dir / f"epoch_{K}.pth"  # saved before the scaling: what PBT hands over
    assert donor_file.is_file()

    # the fork, as DrunTrainable.load_checkpoint sets it up: the donor's file copied into the
    # trial's own work_dir, resumed, and the trial's own values applied after the resume
    fork_dir = tmp_path / "trials" / "fork"
    (fork_dir / "tune_restore").mkdir(parents=True)
    copy = fork_dir / "tune_restore" / f"donor-{donor_file.name}"
    shutil.copy2(donor_file, copy)
    shutil.copy2(checksum_path(donor_file), checksum_path(copy))
    donor_iter = load_file(donor_file, "resume")["meta"]["iter"]
    fork_cfg = trial_config(
        base,
        {**values, LR: lr * 0.5},
        "fork",
        str(fork_dir),
        resume=str(copy),
        fork={"donor": "donor", "iteration": donor_iter, "changes": {LR: [lr, lr * 0.5]}},
    )
    fork = _train(fork_cfg)

    theirs = dict(donor.model.named_parameters())
    mine = dict(fork.model.named_parameters())
    assert theirs.keys() == mine.keys()
    for name, param in mine.items():
        assert torch.equal(param, theirs[name]), name
    for group, ref in zip(
        fork.optim_wrapper.param_groups, donor.optim_wrapper.param_groups, strict=True
    ):
        assert group["lr"] == ref["lr"] and group["initial_lr"] == ref["initial_lr"] == lr * 0.5
    for sched, ref in zip(fork.param_schedulers, donor.param_schedulers, strict=True):
        inner, ref_inner = getattr(sched, "scheduler", sched), getattr(ref, "scheduler", ref)
        assert inner.base_lrs == ref_inner.base_lrs == [lr * 0.5]

    # the fork is logged with where it came from, and keeps its own checkpoint bookkeeping:
    # every file its CheckpointHook names is in its own work_dir
    log = (fork_dir / "logs" / "run.log").read_text()
    assert (
        f"PBT fork: continuing trial donor's run from iteration {donor_iter} with "
        f"{LR} {lr:g} -> {lr * 0.5:g}" in log
    )
    saved = fork.get_hook("checkpoint").saved_files()
    assert saved["best"] and all(p.parent == fork_dir for p in saved["best"] + saved["last"])
    assert json.loads(json.dumps(saved, default=str))  # plain paths
    assert not list(fork_dir.glob(f"epoch_{K}.pth"))  # the donor's files are not recreated


def test_a_resumed_trial_keeps_a_model_directory_as_load_from_and_drops_a_checkpoint(tmp_path):
    """A model directory builds the model (and gives back a frozen base a slim checkpoint left
    out), so a trial resumed or forked keeps it; a checkpoint file as load_from is superseded."""
    pretrained = tmp_path / "llama"
    pretrained.mkdir()
    (pretrained / "config.json").write_text("{}")
    (pretrained / "model.safetensors").write_bytes(b"")
    ckpt = str(tmp_path / "donor" / "iter_4.pth")
    kept = trial_config(dict(load_from=str(pretrained)), {}, "t1", str(tmp_path / "t1"),
                        resume=ckpt)
    assert kept["load_from"] == str(pretrained) and kept["resume"] == ckpt
    dropped = trial_config(dict(load_from=str(tmp_path / "x.pth")), {}, "t2",
                           str(tmp_path / "t2"), resume=ckpt)
    assert "load_from" not in dropped
