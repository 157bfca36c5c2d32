"""Joining a Ray cluster that uses token authentication without its token is one line saying what
to set, within seconds (``ray.init`` retries for ~20 s, a warning a second, then ends in a
67-line traceback that names no setting)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.local_cluster import head_env

pytestmark = [pytest.mark.integration, pytest.mark.slow("Ray heads of its own with token authentication")]
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "drun0test0token0" * 2  # 32 characters


@pytest.fixture(scope="module")
def token_head():
    """A head started by the project's script with RAY_AUTH_MODE=token and its own ports and
    temp dir (the session's in-process cluster may be running)."""
    temp = Path("/tmp") / f"drun-auth-{os.getpid()}"
    env = head_env(temp, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN)
    out = subprocess.run(["bash", str(ROOT / "cluster/local/start_head.sh"), "2"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    yield env
    subprocess.run(["bash", str(ROOT / "cluster/local/stop.sh")], env=env,
                   capture_output=True, timeout=120)


@pytest.mark.integration
@pytest.mark.parametrize("client", [
    {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "another0token000" * 2},  # the wrong token
    {},  # a shell that never set RAY_AUTH_MODE nor a token
])
def test_a_cluster_that_refuses_this_shells_token_is_one_line_naming_what_to_set(
        token_head, tmp_path, client):
    env = {k: v for k, v in token_head.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    env.update(client, HOME=str(tmp_path))  # no ~/.ray/auth_token of this machine's user
    address = f"127.0.0.1:{token_head['RAY_PORT']}"
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "distributed_runner.cli", "train", "configs/digits_cnn.py",
         "--launcher", "ray", "--num-workers", "1", "--address", address,
         "--work-dir", str(tmp_path / "wd")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - start
    assert out.returncode == 2, out.stderr[-3000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"drun: error: launcher.address: the Ray cluster at {address} "
                           f"refused this shell's authentication"), out.stderr[-3000:]
    assert f"RAY_AUTH_MODE={client.get('RAY_AUTH_MODE', 'unset')}" in last
    assert "RAY_AUTH_TOKEN" in last and "Traceback" not in out.stderr
    # Ray's own C++ client prints one warning line before our error; no retry loop
    assert len(out.stderr.strip().splitlines()) <= 3, out.stderr
    assert took < 30
