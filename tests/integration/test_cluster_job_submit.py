"""A real head node on 127.0.0.1 (cluster/local/start_head.sh, 2 CPUs) and ``ray job submit
--working-dir`` of the digits example with 2 workers, twice with the same run name: the second
submission resumes from the first one's checkpoint instead of starting over."""
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def head_node(tmp_path_factory):
    temp = Path("/tmp") / f"drun-ray-{os.getpid()}"  # short: Ray's socket paths have a limit
    # its own ports and temp dir: another Ray (the session's in-process cluster) may be running
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_TEMP_DIR=str(temp),
               **{name: str(free_port()) for name in (
                   "RAY_PORT", "RAY_DASHBOARD_PORT", "RAY_AGENT_LISTEN_PORT",
                   "RAY_AGENT_GRPC_PORT", "RAY_RUNTIME_ENV_AGENT_PORT",
                   "RAY_METRICS_EXPORT_PORT")})
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(["bash", str(ROOT / "cluster/local/start_head.sh"), "2"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    yield env, f"http://127.0.0.1:{env['RAY_DASHBOARD_PORT']}"
    subprocess.run(["bash", str(ROOT / "cluster/local/stop.sh")], env=env, capture_output=True,
                   timeout=120)


def submit(env, address, work_dir, epochs):
    """``ray job submit``; retried while the new head's job agent is still registering."""
    deadline = time.monotonic() + 90
    while True:
        out = _submit(env, address, work_dir, epochs)
        if "No available agent" not in out.stderr or time.monotonic() > deadline:
            return out
        time.sleep(3)


def _submit(env, address, work_dir, epochs):
    return subprocess.run(
        ["ray", "job", "submit", "--address", address, "--working-dir", ".",
         "--runtime-env", "cluster/runtime_env.yaml", "--",
         "drun", "train", "configs/digits_cnn.py", "--launcher", "ray", "--address", "auto",
         "--num-workers", "2", "--work-dir", str(work_dir), "--name", "digits-job",
         "--cfg-options", f"train_cfg.max_epochs={epochs}", "param_scheduler=None",
         "default_hooks.checkpoint.interval=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_job_submit_then_resubmit_resumes(head_node, tmp_path):
    env, address = head_node
    first = submit(env, address, tmp_path, epochs=1)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "succeeded" in first.stdout + first.stderr
    storage = tmp_path / "ray_storage" / "digits-job"
    assert any(p.name.startswith("epoch_1-") for p in storage.iterdir())
    second = submit(env, address, tmp_path, epochs=2)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    logs = second.stdout + second.stderr
    assert "Ray restored checkpoint" in logs and "resumed from" in logs
    assert "Epoch(train) [1]" not in logs and "Epoch(train) [2]" in logs
    assert any(p.name.startswith("epoch_2-") for p in storage.iterdir())
