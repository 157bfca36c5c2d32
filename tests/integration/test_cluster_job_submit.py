"""The docs' cluster page (docs/how-to/cluster.md, ``docs-test: job-submit``), end to end, on a
real head node on 127.0.0.1 (cluster/local/start_head.sh, 2 CPUs, its own temp dir and ports —
the session's in-process cluster may run beside it):

* ``ray job submit --working-dir .`` of the page's command, which leaves work_dir relative:
  the run lands under ``DRUN_WORK_ROOT``, not in Ray's temporary package folder; submitted again
  with the same name and ``--resume`` it resumes.
* ``drun train --address HEAD`` with ``MLFLOW_TRACKING_URI`` exported in the driver's shell only:
  the workers (started by ``ray start``, not by the driver) log to that server — one run, named
  after the run, tagged with the git commit, FINISHED.
* ``--address auto`` with two clusters on the machine is refused, naming both.
* ``cluster/local/stop.sh`` stops this cluster completely and leaves the other one running.
"""
import os
import shlex
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.docs_blocks import docs_commands
from tests.integration.local_cluster import head_env

pytestmark = [pytest.mark.integration, pytest.mark.slow("a real head (ray start) and ray job submit runs on it"),
              pytest.mark.timeout(420)]
ROOT = Path(__file__).resolve().parents[2]


def page_commands() -> tuple[list[str], list[str], list[str]]:
    """The page's block: auth mode, start the head, submit, stop — as argv lists."""
    export, start, submit_, stop = docs_commands("job-submit")
    assert export == "export RAY_AUTH_MODE=disabled"
    assert shlex.split(stop) == ["cluster/local/stop.sh"]
    return shlex.split(start), shlex.split(submit_), shlex.split(stop)


@pytest.fixture(scope="module")
def head_node(tmp_path_factory):
    temp = Path("/tmp") / f"drun-ray-{os.getpid()}"  # short: Ray's socket paths have a limit
    work_root = tmp_path_factory.mktemp("drun_work_root")
    # its own ports and temp dir: another Ray (the session's in-process cluster) may be running
    env = head_env(temp, RAY_AUTH_MODE="disabled", DRUN_WORK_ROOT=str(work_root))
    start, _, stop = page_commands()
    out = subprocess.run(["bash", str(ROOT / start[0]), *start[1:]], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    yield env
    subprocess.run(["bash", str(ROOT / stop[0])], env=env, capture_output=True, timeout=120)


def submit(env, epochs):
    """The page's ``ray job submit`` (its address: this head's dashboard port), cut down to
    ``epochs``; retried while the new head's job agent registers."""
    _, argv, _ = page_commands()
    assert argv[:4] == ["ray", "job", "submit", "--address"]
    argv[4] = f"http://127.0.0.1:{env['RAY_DASHBOARD_PORT']}"
    assert argv[argv.index("--") + 1:] == [
        "drun", "train", "configs/digits_cnn.py", "--launcher", "ray", "--address", "auto",
        "--num-workers", "2", "--name", "digits-job", "--resume"]
    deadline = time.monotonic() + 90
    while True:
        out = subprocess.run(
            [*argv, "--cfg-options", f"train_cfg.max_epochs={epochs}", "param_scheduler=None",
             "default_hooks.checkpoint.interval=1"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        if "No available agent" not in out.stderr or time.monotonic() > deadline:
            return out
        time.sleep(3)


def test_job_submit_keeps_its_results_and_resubmit_resumes(head_node):
    first = submit(head_node, epochs=1)
    logs = first.stdout + first.stderr
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    assert "succeeded" in logs
    work_dir = Path(head_node["DRUN_WORK_ROOT"]) / "work_dirs" / "digits_cnn"
    assert f"using {work_dir}" in logs  # said where the relative work_dir went
    assert "_ray_pkg_" not in logs.split("work_dir ")[-1].splitlines()[0]
    storage = work_dir / "ray_storage" / "digits-job"
    # Ray keeps what the run's folder keeps: the newest report, here the epoch's best
    assert any(p.name.startswith(("epoch_1-", "best_accuracy_epoch_1-")) for p in storage.iterdir())
    assert (work_dir / "digits-job" / "epoch_1.pth").is_file()  # the run's folder: its --name
    second = submit(head_node, epochs=2)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    logs = second.stdout + second.stderr
    assert "Ray restored checkpoint" in logs and "resumed from" in logs
    assert "Epoch(train) [1]" not in logs and "Epoch(train) [2]" in logs
    assert any(p.name.startswith(("epoch_2-", "best_accuracy_epoch_2-")) for p in storage.iterdir())


def test_drivers_mlflow_environment_reaches_the_workers_of_a_running_head(head_node,
                                                                          mlflow_server,
                                                                          tmp_path):
    from mlflow.tracking import MlflowClient

    experiment = f"head-{uuid.uuid4().hex[:6]}"
    password = f"pw-{uuid.uuid4().hex}"  # in the URI: used, never shown or stored
    env = dict(head_node, MLFLOW_TRACKING_URI=mlflow_server.uri.replace(
        "http://", f"http://drun:{password}@"), MLFLOW_EXPERIMENT_NAME=experiment)
    gcs = f"127.0.0.1:{env['RAY_PORT']}"
    out = subprocess.run(
        [sys.executable, "-m", "distributed_runner.cli", "train", "configs/digits_cnn.py",
         "--launcher", "ray", "--address", gcs, "--num-workers", "2",
         "--work-dir", str(tmp_path / "wd"),
         "--cfg-options", "train_cfg.max_epochs=1", "default_hooks.logger.sinks=['mlflow']"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    joined = next(line for line in out.stdout.splitlines() if "joined" in line)
    assert "joined the Ray cluster at " in joined and joined.endswith(f":{env['RAY_PORT']}")
    assert f"MLflow http://drun:******@127.0.0.1:{mlflow_server.port}" in out.stdout
    assert password not in out.stdout + out.stderr
    # nor in what the cluster shows about its jobs (a runtime_env would be listed there)
    with urllib.request.urlopen(f"http://127.0.0.1:{env['RAY_DASHBOARD_PORT']}/api/jobs/",
                                timeout=30) as answer:
        jobs = answer.read().decode()
    assert "runtime_env" in jobs and password not in jobs
    assert not (tmp_path / "wd" / "mlflow.db").exists()  # not the workers' SQLite fallback
    client = MlflowClient(mlflow_server.uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.info.run_name.startswith("wd-") and run.info.run_name != experiment
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    assert run.data.tags["git_commit"] == head and run.data.tags["world_size"] == "2"
    assert "train/loss" in run.data.metrics and "val/accuracy" in run.data.metrics


def test_address_auto_with_two_clusters_is_refused(head_node, ray_cluster, tmp_path):
    env = dict(head_node)
    out = subprocess.run(
        [sys.executable, "-m", "distributed_runner.cli", "train", "configs/digits_cnn.py",
         "--launcher", "ray", "--address", "auto", "--work-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("drun: error:")]
    assert len(errors) == 1 and "launcher.address: 'auto' is ambiguous" in errors[0]
    assert f":{head_node['RAY_PORT']}" in errors[0]


def live_processes(fragment: str) -> list[str]:
    """Command lines of the live (not zombie) processes whose command line holds ``fragment``."""
    ps = subprocess.run(["ps", "-eww", "-o", "stat=,args="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines()
            if fragment in line and not line.lstrip().startswith("Z")]


def head_agents(session: str) -> dict[int, str]:
    """Pid -> command line of the agents the head's raylet started (its children: their own
    command lines do not name the session). Counting agents machine-wide instead was flaky:
    another test's local Ray may start or stop beside this one (CI of 2026-12-02)."""
    ps = subprocess.run(["ps", "-eww", "-o", "pid=,ppid=,args="], capture_output=True,
                        text=True).stdout
    rows = [line.split(None, 2) for line in ps.splitlines() if len(line.split(None, 2)) == 3]
    raylets = {pid for pid, _, args in rows if session in args and "raylet/raylet" in args}
    return {int(pid): args for pid, ppid, args in rows
            if ppid in raylets and args.startswith("ray::") and "Agent" in args}


def test_stop_script_stops_this_cluster_completely_and_only_it(head_node, ray_cluster):
    import ray

    session = str(Path(head_node["RAY_TEMP_DIR"], "session_latest").resolve())
    agents = head_agents(session)  # by pid: other tests start and stop Rays meanwhile
    assert live_processes(session) and "ray::DashboardAgent" in agents.values()
    out = subprocess.run(["bash", str(ROOT / "cluster/local/stop.sh")], env=head_node,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "stopped the Ray cluster of" in out.stdout
    assert live_processes(session) == []
    # the head's agents (their command lines no longer name the session) went with it
    assert not [pid for pid in agents if Path(f"/proc/{pid}").exists()
                and not Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")]
    assert not [p for p in live_processes("ray.util.client.server")
                if f":{head_node['RAY_PORT']} " in p]
    # the other cluster (this session's) still runs work
    assert ray.get(ray.remote(lambda: 42).remote(), timeout=60) == 42
