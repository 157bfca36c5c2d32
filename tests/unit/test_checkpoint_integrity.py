"""Checkpoints that cannot be trusted are never loaded, and resuming never loses work: bit rot
and truncation are caught by the checksum written beside each file, ``--resume`` falls back to
the newest checkpoint that verifies (and says so), a broken ``last_checkpoint`` pointer or a
moved work_dir never restarts a run from iteration 0, interrupted writes are cleaned up, and a
full disk, another model's checkpoint or a hostile pickle are one line each."""
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from distributed_runner.checkpoint.files import CheckpointDamaged, checksum_path, load_file
from distributed_runner.core.errors import ConfigError
from tests.toy import make_runner, params_of

ROOT = Path(__file__).resolve().parents[2]
HOOKS = dict(checkpoint=dict(type="CheckpointHook", interval=1))  # epoch_1/2/3.pth


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 3-epoch run (epoch_1..3.pth, pointer at epoch_3) and its final weights."""
    work_dir = tmp_path_factory.mktemp("trained") / "wd"
    runner = make_runner(work_dir, default_hooks=HOOKS)
    runner.train()
    return work_dir, params_of(runner.model)


def copy_of(trained, tmp_path) -> Path:
    work_dir = tmp_path / "wd"
    shutil.copytree(trained[0], work_dir)
    return work_dir


def flip_a_byte_inside_a_tensor(path: Path) -> None:
    ckpt = torch.load(path, weights_only=True)
    raw = ckpt["state_dict"]["fc1.weight"].numpy().tobytes()
    data = bytearray(path.read_bytes())
    at = data.find(raw) + len(raw) // 2
    assert at > len(raw) // 2, "the tensor's bytes are in the file"
    data[at] ^= 0x10
    path.write_bytes(bytes(data))


def resume(work_dir, runlog, **extra):
    runner = make_runner(work_dir, default_hooks=HOOKS, resume=True, log_level="INFO", **extra)
    runner.train()
    messages = [r.getMessage() for r in runlog.records]
    return runner, messages


def test_bit_rot_is_caught_and_resume_falls_back_to_the_newest_good_checkpoint(trained, tmp_path,
                                                                                runlog):
    work_dir = copy_of(trained, tmp_path)
    newest = work_dir / "epoch_3.pth"
    flip_a_byte_inside_a_tensor(newest)
    torch.load(newest, weights_only=True)  # torch alone would load the rotten weights
    with pytest.raises(CheckpointDamaged) as err:
        load_file(newest, "load_from")
    assert str(err.value).startswith(f"load_from: '{newest}' is damaged: its CRC-32 is ")
    with pytest.raises(ConfigError, match="is damaged"):  # load_from: refused, one line
        make_runner(tmp_path / "other", load_from=str(newest)).train()
    runner, messages = resume(work_dir, runlog)
    warning = next(m for m in messages if m.startswith("resume: "))
    assert "epoch_3.pth: " in warning and "CRC-32" in warning
    assert "resuming from epoch_2.pth (iter 20)" in warning
    assert any("resumed from" in m and "epoch_2.pth" in m for m in messages)
    final = params_of(runner.model)  # epoch 3 again, exactly: the same weights as before
    assert all(torch.equal(final[k], trained[1][k]) for k in final)


def test_a_truncated_newest_checkpoint_is_skipped(trained, tmp_path, runlog):
    work_dir = copy_of(trained, tmp_path)
    newest = work_dir / "epoch_3.pth"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    _, messages = resume(work_dir, runlog)
    warning = next(m for m in messages if m.startswith("resume: "))
    assert "truncated" in warning and "resuming from epoch_2.pth" in warning


@pytest.mark.parametrize("pointer", ["dangling", "empty", "folder", "binary", "absolute-moved"])
def test_a_broken_or_moved_pointer_never_restarts_from_scratch(trained, tmp_path, runlog, pointer):
    work_dir = copy_of(trained, tmp_path)
    (work_dir / "epoch_3.pth").unlink()  # so the newest file is not the pointer's old target
    target = {"dangling": "epoch_9.pth", "empty": "", "folder": "logs",
              "binary": b"\x80\x00\xff\xfe", "absolute-moved": "/gone/elsewhere/epoch_2.pth"}
    value = target[pointer]
    (work_dir / "last_checkpoint").write_bytes(value if isinstance(value, bytes)
                                               else value.encode())
    runner, messages = resume(work_dir, runlog)
    assert any("resumed from" in m and "epoch_2.pth" in m for m in messages), messages
    assert runner.iter == 30 and not any("starting fresh" in m for m in messages)


def test_a_moved_work_dir_resumes_through_its_relative_pointer(trained, tmp_path, runlog):
    moved = copy_of(trained, tmp_path / "moved")
    assert (moved / "last_checkpoint").read_text() == "epoch_3.pth"
    _, messages = resume(moved, runlog)
    assert any("resumed from" in m and str(moved / "epoch_3.pth") in m for m in messages)
    assert not any(m.startswith("resume: ") for m in messages)  # nothing skipped


def test_checkpoints_that_all_fail_are_one_line_and_nothing_trains(trained, tmp_path):
    work_dir = copy_of(trained, tmp_path)
    for path in work_dir.glob("*.pth"):
        flip_a_byte_inside_a_tensor(path)
    before = {p.name: p.read_bytes() for p in work_dir.glob("*.pth")}
    with pytest.raises(ConfigError) as err:
        make_runner(work_dir, default_hooks=HOOKS, resume=True).train()
    text = str(err.value)
    assert text.startswith(f"resume: {work_dir} has checkpoints but none verifies (")
    assert "pass --resume PATH" in text and "\n" not in text
    assert {p.name: p.read_bytes() for p in work_dir.glob("*.pth")} == before


def test_interrupted_writes_are_removed_when_the_run_starts(trained, tmp_path, runlog):
    work_dir = copy_of(trained, tmp_path)
    stale = work_dir / ".iter_25.pth.k2j3h4.tmp"  # what a SIGKILL mid-write leaves
    stale.write_bytes(b"\0" * 1_000_000)
    _, messages = resume(work_dir, runlog)
    assert not stale.exists()
    assert any(m.startswith("removed 1 interrupted checkpoint write(s)") for m in messages)


def test_a_checkpoint_of_another_model_names_the_first_differing_tensors(trained, tmp_path):
    work_dir = copy_of(trained, tmp_path)
    with pytest.raises(ConfigError) as err:
        make_runner(work_dir, default_hooks=HOOKS, resume=True,
                    model=dict(type="ToyModel", hidden=16)).train()
    text = str(err.value)
    assert text.startswith("resume: ") and "does not fit the model (shapes differ: " in text
    assert "fc1.weight [8, 4] in the checkpoint, [16, 4] in the model" in text
    assert "\n" not in text and len(text) < 700


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_hostile_or_random_files_are_refused_without_torchs_advice(tmp_path):
    evil = tmp_path / "evil.pth"
    evil.write_bytes(pickle.dumps(Evil(), protocol=2))  # torch's own protocol: GLOBAL os.system
    with pytest.raises(CheckpointDamaged) as err:
        load_file(evil, "load_from")
    text = str(err.value)
    assert "asks to run code (" in text and "system" in text and "\n" not in text
    assert "weights_only" not in text and "trust" not in text and "file an issue" not in text
    evil.write_bytes(pickle.dumps(Evil(), protocol=4))  # STACK_GLOBAL: refused as an operand
    with pytest.raises(CheckpointDamaged) as err:
        load_file(evil, "load_from")
    assert "instructions other than tensors and plain data" in str(err.value)
    assert "weights_only" not in str(err.value) and "file an issue" not in str(err.value)
    noise = tmp_path / "noise.pth"
    noise.write_bytes(os.urandom(4096))
    with pytest.raises(CheckpointDamaged) as err:
        load_file(noise, "load_from")
    assert "Please file an issue" not in str(err.value) and "\n" not in str(err.value)


def test_the_checksum_is_written_beside_each_checkpoint_and_removed_with_it(trained):
    work_dir, _ = trained
    for path in work_dir.glob("*.pth"):
        assert checksum_path(path).is_file(), path


def test_a_full_disk_is_one_line_and_the_previous_checkpoint_stays_the_resume_point(tmp_path):
    mount = tmp_path / "small_disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2500k", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        config = tmp_path / "big.py"
        config.write_text(
            "custom_imports = dict(imports=['tests.toy'])\n"
            "model = dict(type='ToyModel', hidden=20000)\n"  # a checkpoint of about 1.4 MB
            "train_dataloader = dict(dataset=dict(type='ToyDataset', n=8), batch_size=4)\n"
            "train_cfg = dict(max_epochs=3)\n"
            "optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9))\n"
            "default_hooks = dict(logger=dict(type='LoggerHook', sinks=['jsonl']),\n"
            "                     checkpoint=dict(type='CheckpointHook', interval=1))\n")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-m", "distributed_runner.cli", "train",
                              str(config), "--work-dir", str(mount / "wd")], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 1, out.stderr[-3000:]
        lines = out.stderr.strip().splitlines()
        assert lines[-1].startswith("drun: error: no space left on device writing epoch_2.pth")
        assert "the checkpoints written before it are intact" in lines[-1]
        assert "Traceback" not in out.stderr and "on_error" not in out.stderr
        (work_dir,) = (mount / "wd").iterdir()  # the run's folder
        assert (work_dir / "last_checkpoint").read_text() == "epoch_1.pth"
        assert load_file(work_dir / "epoch_1.pth", "resume")["meta"]["iter"] == 2
        assert not list(work_dir.glob(".*.tmp")) and not (work_dir / "epoch_2.pth").exists()
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)
