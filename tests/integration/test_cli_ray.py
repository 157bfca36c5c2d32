"""The docs' Ray command (getting started, ``docs-test: ray-local``), as a user types it:
``drun train CONFIG --launcher ray --num-workers 2`` (its own local Ray, started and stopped by
drun)."""
import os
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
