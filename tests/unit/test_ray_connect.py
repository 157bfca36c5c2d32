"""The Ray driver's choices that Ray would otherwise make silently: which cluster 'auto' joins,
where a relative path goes inside a ``ray job submit`` package folder, which environment the
workers get, what travels with the config to them (its git commit); and the probes that turn a
dead address or an unwritable storage path into one line within seconds."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distributed_runner.core.config import Config
from distributed_runner.core.errors import ConfigError
from distributed_runner.launch.ray_connect import (
    forwarded_env,
    in_job_package,
    persistent_path,
    resolve_address,
)

ROOT = Path(__file__).resolve().parents[2]


def test_address_explicit_env_and_the_one_running_cluster():
    assert resolve_address(None, {}, clusters=["1.2.3.4:6379"]) is None  # start a local Ray
    assert resolve_address("10.0.0.1:6379", {"RAY_ADDRESS": "x:1"}) == "10.0.0.1:6379"
    assert resolve_address(None, {"RAY_ADDRESS": "x:1"}) == "x:1"
    # inside `ray job submit` the entrypoint's RAY_ADDRESS names the job's cluster
    assert resolve_address("auto", {"RAY_ADDRESS": "10.0.0.2:6379"},
                           clusters=["a:1", "b:2"]) == "10.0.0.2:6379"
    assert resolve_address("auto", {}, clusters=["127.0.0.1:6379"]) == "127.0.0.1:6379"
    assert resolve_address(None, {"RAY_ADDRESS": "auto"}, clusters=["h:1"]) == "h:1"


@pytest.mark.parametrize("clusters,fragment", [
    ([], "'auto' found no running Ray cluster"),
    (["127.0.0.1:6379", "127.0.0.1:50123"], "'auto' is ambiguous: 2 Ray clusters"),
])
def test_auto_without_exactly_one_cluster_is_one_line(clusters, fragment):
    with pytest.raises(ConfigError) as err:
        resolve_address("auto", {}, clusters=clusters)
    text = str(err.value)
    assert text.startswith("launcher.address: ") and fragment in text and "\n" not in text
    for address in clusters:
        assert address in text


def job_package(tmp_path) -> Path:
    pkg = tmp_path / "session_x" / "runtime_resources" / "working_dir_files" / "_ray_pkg_ab12"
    pkg.mkdir(parents=True)
    return pkg


def test_relative_paths_leave_a_job_package_folder(tmp_path):
    pkg = job_package(tmp_path)
    assert in_job_package(pkg) and not in_job_package(tmp_path)
    root = tmp_path / "persistent"
    path, note = persistent_path("work_dirs/digits", "work_dir", {"DRUN_WORK_ROOT": str(root)},
                                 cwd=pkg)
    assert path == str(root / "work_dirs" / "digits")
    assert "work_dir 'work_dirs/digits' is relative" in note and str(root) in note
    assert "DRUN_WORK_ROOT" in note
    # absolute paths and URIs stay; outside a package folder a relative path is the cwd's
    assert persistent_path("/data/wd", "work_dir", cwd=pkg) == ("/data/wd", None)
    assert persistent_path("s3://b/p", "launcher.storage_path", cwd=pkg) == ("s3://b/p", None)
    assert persistent_path("wd", "work_dir", cwd=tmp_path) == (str(tmp_path / "wd"), None)
    default, _ = persistent_path("wd", "work_dir", {}, cwd=pkg)
    assert default == str(Path.home() / "drun" / "wd")


def test_drun_inside_a_job_package_writes_where_it_says(tmp_path):
    pkg = job_package(tmp_path)
    config = pkg / "toy.py"
    config.write_text(
        "custom_imports = dict(imports=['tests.toy'])\n"
        "model = dict(type='ToyModel')\n"
        "work_dir = 'work_dirs/toy'\n"
        "train_dataloader = dict(dataset=dict(type='ToyDataset', n=8), batch_size=4)\n"
        "train_cfg = dict(max_epochs=1)\n"
        "optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))\n"
        "default_hooks = dict(logger=dict(type='LoggerHook', sinks=['jsonl']))\n")
    root = tmp_path / "persistent"
    env = {"DRUN_WORK_ROOT": str(root), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "distributed_runner.cli", "train", "toy.py"],
                         cwd=pkg, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    moved = root / "work_dirs" / "toy"
    assert f"using {moved}" in out.stderr
    assert len(list(moved.glob("*/epoch_1.pth"))) == 1 and not (pkg / "work_dirs").exists()


def test_workers_get_the_drivers_mlflow_and_wandb_settings_and_nothing_else():
    environ = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "MLFLOW_TRACKING_TOKEN": "t",
               "MLFLOW_EXPERIMENT_NAME": "e", "HOME": "/root", "AWS_REGION": "x",
               "WANDB_API_KEY": "k", "WANDB_MODE": "offline", "WAND_B": "typo"}
    assert forwarded_env(environ) == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000",
                                      "MLFLOW_TRACKING_TOKEN": "t", "MLFLOW_EXPERIMENT_NAME": "e",
                                      "WANDB_API_KEY": "k", "WANDB_MODE": "offline"}


def test_git_commit_of_the_config_travels_with_it(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "cfg.py").write_text("model = dict(type='ToyModel')\n")
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(git + ["add", "cfg.py"], cwd=repo, check=True)
    subprocess.run(git + ["commit", "-qm", "c"], cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                          text=True).stdout.strip()
    cfg = Config.fromfile(repo / "cfg.py")
    assert cfg.git_commit == head and cfg.source() == {"filename": str(repo / "cfg.py"),
                                                       "git_commit": head}
    outside = tmp_path / "cfg.py"
    outside.write_text("model = dict(type='ToyModel')\n")
    assert Config.fromfile(outside).git_commit is None
    # a worker rebuilds the config from plain data and adopts the driver's source
    worker = Config(dict(cfg)).with_source(cfg.source())
    assert worker.git_commit == head and worker.filename == str(repo / "cfg.py")
    assert Config({}).git_commit is None


def closed_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: nothing listens


@pytest.mark.serial("an error due within seconds")
def test_an_address_nobody_listens_at_is_one_line_in_seconds():
    import socket
    import time

    from distributed_runner.launch.ray_connect import probe_address

    port = closed_port()
    start = time.monotonic()
    with pytest.raises(ConfigError) as err:
        probe_address(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 5
    assert str(err.value).startswith(f"launcher.address: nothing answers at 127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="is not HOST:PORT"):
        probe_address("localhost")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        probe_address(f"ray://127.0.0.1:{port}")  # answers: a client address is not probed
        start = time.monotonic()  # a GCS address must answer as Ray's: this port never does
        with pytest.raises(ConfigError) as err:
            probe_address(f"127.0.0.1:{port}", gcs_timeout=1.0)
        assert time.monotonic() - start < 3
        assert str(err.value) == (
            f"launcher.address: 127.0.0.1:{port} accepts connections but does not answer as "
            f"a Ray cluster's GCS within 1 s: check the port (the head's, 6379 unless ray "
            f"start --port said otherwise)")


def test_an_unwritable_storage_path_is_one_line(tmp_path):
    from distributed_runner.launch.ray_connect import check_storage

    check_storage(str(tmp_path / "storage"))
    assert (tmp_path / "storage").is_dir() and not any((tmp_path / "storage").iterdir())
    check_storage(f"file://{tmp_path / 'uri_storage'}")  # a URI goes through pyarrow's fs
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ConfigError) as err:
        check_storage(str(tmp_path / "a_file" / "storage"))  # a path under a regular file
    assert str(err.value).startswith(f"launcher.storage_path: cannot write to {tmp_path}")


def test_drun_with_a_dead_address_fails_fast_without_starting_ray(tmp_path):
    import time

    port = closed_port()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "distributed_runner.cli", "train",
                          "configs/digits_cnn.py", "--launcher", "ray", "--address",
                          f"127.0.0.1:{port}", "--work-dir", str(tmp_path)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        f"drun: error: launcher.address: nothing answers at 127.0.0.1:{port} (Connection "
        f"refused): is the head running (ray status --address 127.0.0.1:{port})? check host "
        f"and port"]
    assert elapsed < 60 and "Started a local Ray" not in out.stdout + out.stderr
