"""Ctrl-C is a pause (distributed_runner/core/preemption.py): SIGINT to a running ``drun train``
ends the current iteration, writes a checkpoint, closes the sinks, prints one line with the
iteration reached and the command that continues, and exits 130; that command, run as printed,
ends with the uninterrupted run's weights. A second Ctrl-C exits at once, and one outside the
loop is one line too."""
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from distributed_runner.checkpoint.files import read_pointer
from distributed_runner.cli import paused_line
from distributed_runner.core.preemption import TrainingPreempted
from tests.toy import assert_state_equal, base_cfg, make_runner, params_of

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
DRUN = [sys.executable, "-m", "distributed_runner.cli"]


def start(tmp_path, sleep=0.05, wait_for="epoch_1.pth"):
    cfg = base_cfg(tmp_path / "wd", custom_imports=["tests.hook_probes"],
                   custom_hooks=[dict(type="SleepHook", seconds=sleep), dict(type="TouchHook")])
    cfg["default_hooks"]["logger"]["sinks"] = ["jsonl"]
    (tmp_path / "cfg.py").write_text("\n".join(f"{k} = {v!r}" for k, v in cfg.items()))
    command = ["train", str(tmp_path / "cfg.py"), "--cfg-options", "log_level=WARNING"]
    proc = subprocess.Popen(DRUN + command, cwd=REPO, env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (tmp_path / "wd" / wait_for).is_file():
        time.sleep(0.05)
    return proc


@pytest.mark.slow("drun subprocesses interrupted and continued")
def test_ctrl_c_checkpoints_says_how_to_continue_and_that_command_finishes_the_run(tmp_path):
    proc = start(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    (line,) = [x for x in err.splitlines() if x.startswith("drun: ")]
    assert line.startswith("drun: stopped by Ctrl-C after iteration ")
    stopped_at = int(line.split("after iteration ")[1].split(";")[0])
    assert 10 <= stopped_at < 30
    checkpoint = line.split("checkpoint ")[1].split(". Continue with: ")[0]
    assert Path(checkpoint).name in (f"iter_{stopped_at}.pth", f"epoch_{stopped_at // 10}.pth")
    assert torch.load(checkpoint, weights_only=True)["meta"]["iter"] == stopped_at
    again = shlex.split(line.split("Continue with: ")[1])
    assert again[0] == "drun" and again[-1] == "--resume"
    done = subprocess.run(DRUN + again[1:], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    final = torch.load(read_pointer(tmp_path / "wd"), weights_only=True)
    assert final["meta"]["iter"] == 30
    full = make_runner(tmp_path / "full")
    full.train()
    assert_state_equal(final["state_dict"], params_of(full.model))


def test_a_second_ctrl_c_exits_at_once(tmp_path):
    proc = start(tmp_path, sleep=2.0, wait_for="trained_1")  # the first Ctrl-C waits 2 s
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and time.monotonic() - sent < 1.5, err[-2000:]
    assert "Ctrl-C again: exiting now, without a checkpoint" in err


def test_the_continue_command_replaces_any_resume_and_keeps_the_rest():
    stopped = TrainingPreempted(("SIGINT",), "/w/iter_7.pth", iteration=7)
    line = paused_line(stopped, ["train", "my cfg.py", "--resume", "/w/old.pth", "--cfg-options",
                                 "a=1"])
    assert line == ("stopped by Ctrl-C after iteration 7; checkpoint /w/iter_7.pth. Continue "
                    "with: drun train 'my cfg.py' --cfg-options a=1 --resume")
