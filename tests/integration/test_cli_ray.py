"""The docs' Ray command (getting started, ``docs-test: ray-local``), as a user types it:
``drun train CONFIG --launcher ray --num-workers 2`` (its own local Ray, started and stopped by
drun)."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_blocks import docs_commands

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
ROOT = Path(__file__).resolve().parents[2]


def test_drun_train_on_two_ray_workers(ray_cluster, tmp_path):
    """With another cluster running on the machine (this session's): Ray's own processes in
    drun's local cluster must still find theirs, not die with tracebacks."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.1")
    env.pop("RAY_ADDRESS", None)
    argv = shlex.split(docs_commands("ray-local")[0])
    assert argv == ["drun", "train", "configs/digits_cnn.py", "--launcher", "ray",
                    "--num-workers", "2"]
    out = subprocess.run(
        [sys.executable, "-m", "distributed_runner.cli", *argv[1:], "--work-dir", str(tmp_path),
         "--cfg-options", "train_cfg.max_epochs=2"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=220)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"storage {tmp_path}/ray_storage/{tmp_path.name}" in out.stdout
    assert "joined a local Ray started by this process" in out.stdout
    assert "finished" in out.stdout
    # a clean run is quiet: no traceback, none of Ray Train's placement-group cleaner polling a
    # State API that a dashboard-less Ray lacks, no hook-time warning for the example's hooks
    text = out.stdout + out.stderr
    assert "Traceback" not in text and "GetTimeoutError" not in text
    assert "Failed to query Ray Train Controller" not in text
    assert "took" not in "".join(line for line in text.splitlines() if "WARNING" in line)
    # no error-level line of Ray's own making, none of Ray Train's per-report chatter (drun's
    # launcher.verbose=False): the terminal shows the run
    assert not [line for line in text.splitlines() if re.search(r"\bE \d+ \d+\]|\] E ", line)]
    assert "Reporting training result" not in text
    assert "Checkpoint successfully created" not in text
    reported = [p.name for p in (tmp_path / "ray_storage" / tmp_path.name).iterdir() if p.is_dir()]
    assert any(name.startswith("last-") for name in reported)
    assert (tmp_path / "last.pth").is_file()


def test_impossible_gpu_request_from_the_cli_is_one_line(tmp_path):
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-m", "distributed_runner.cli", "train", "configs/digits_cnn.py",
         "--launcher", "ray", "--num-workers", "2", "--gpu", "--work-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("drun: error:")]
    assert errors == [errors[0]] and "launcher.use_gpu: 2 workers x 1 GPU" in errors[0]


def test_ctrl_c_on_the_driver_pauses_the_workers_and_the_printed_command_continues_exactly(
        tmp_path):
    """Ctrl-C as a terminal sends it (SIGINT to drun's process group; Ray's own processes block
    it): the workers end the iteration, save and report a checkpoint and return; drun prints one
    line with the command that continues and exits 130; that command ends with the weights of
    the run that was never interrupted."""
    import signal
    import time

    import torch

    from distributed_runner.checkpoint.files import read_pointer

    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.1",
               PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    (tmp_path / "cfg.py").write_text(
        f"_base_ = {str(ROOT / 'configs' / 'digits_cnn_ray.py')!r}\n"
        "custom_imports = dict(imports=['distributed_runner.examples.digits', "
        "'tests.hook_probes'])\n"
        "custom_hooks = [dict(type='SyncBuffersHook'), dict(type='SleepHook', seconds=0.2), "
        "dict(type='TouchHook')]\n"
        "train_cfg = dict(by_epoch=True, max_epochs=1)\n"
        "param_scheduler = None\nlog_level = 'WARNING'\n")
    drun = [sys.executable, "-m", "distributed_runner.cli"]
    command = ["train", str(tmp_path / "cfg.py"), "--work-dir", str(tmp_path / "wd")]
    proc = subprocess.Popen(drun + command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and not (tmp_path / "wd" / "trained_5").exists():
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("drun: stopped by Ctrl-C")]
    stopped_at = int(line.split("after iteration ")[1].split(";")[0])
    checkpoint = line.split("checkpoint ")[1].split(". Continue with: ")[0]
    assert torch.load(checkpoint, weights_only=True)["meta"]["iter"] == stopped_at
    assert 5 <= stopped_at < 23
    again = shlex.split(line.split("Continue with: ")[1])
    assert again[:2] == ["drun", "train"] and again[-1] == "--resume"
    done = subprocess.run(drun + again[1:], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=200)
    assert done.returncode == 0, done.stderr[-3000:]
    whole = subprocess.run(drun + ["train", str(tmp_path / "cfg.py"), "--work-dir",
                                   str(tmp_path / "whole")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    assert whole.returncode == 0, whole.stderr[-3000:]
    final = torch.load(read_pointer(tmp_path / "wd"), weights_only=True)
    reference = torch.load(read_pointer(tmp_path / "whole"), weights_only=True)
    assert final["meta"]["iter"] == reference["meta"]["iter"] == 23
    for key, value in reference["state_dict"].items():
        assert torch.equal(final["state_dict"][key], value), key
