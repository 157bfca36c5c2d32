"""``drun tune`` as a user runs it (a subprocess that starts its own local Ray), on the digits
example shrunk to a few epochs: ASHA's early stops are graceful, PBT's forks are exact and
logged, an interrupted sweep resumes; trials' MLflow runs are nested under the sweep's."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.docs_blocks import docs_commands

pytestmark = [pytest.mark.integration, pytest.mark.slow("drun tune sweeps, each starting its own local Ray")]
ROOT = Path(__file__).resolve().parents[2]
LR = "optim_wrapper.optimizer.lr"
SINKS = "default_hooks.logger.sinks=[terminal,jsonl,mlflow]"


def _env(mlflow_server) -> dict:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", MLFLOW_TRACKING_URI=mlflow_server.uri)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env.pop("RAY_ADDRESS", None)
    return env


def _drun(args: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distributed_runner.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _rows(work_dir: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(work_dir / "tune_results.parquet").to_pylist()


def _client(mlflow_server):
    from mlflow.tracking import MlflowClient

    return MlflowClient(mlflow_server.uri)


def _children(client, work_dir: Path) -> tuple[str, dict]:
    parent = json.loads((work_dir / "mlflow_sweep.json").read_text())["run_id"]
    run = client.get_run(parent)
    found = client.search_runs(
        [run.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent}'"
    )
    return parent, {r.data.tags["tune.trial_id"]: r for r in found}


@pytest.mark.timeout(240)
def test_asha_stops_trials_gracefully_and_the_best_config_trains(mlflow_server, tmp_path):
    space = {LR: {"type": "grid_search", "values": [3e-3, 1e-2, 1e-4, 3e-5]}}
    work_dir = tmp_path / "sweep"
    start = time.monotonic()
    # the README's command, shrunk to 4 epochs, its learning rates a grid so that ASHA surely
    # has weak trials to stop, and an MLflow sink
    argv = shlex.split(docs_commands("readme-tune")[0])
    assert argv == ["drun", "tune", "configs/digits_tune.py"]
    out = _drun(
        [
            *argv[1:],
            "--work-dir",
            str(work_dir),
            "--cfg-options",
            "train_cfg.max_epochs=4",
            f"tune.param_space={space!r}",
            "tune.num_samples=1",
            SINKS,
        ],
        _env(mlflow_server),
        timeout=200,
    )
    wall = time.monotonic() - start
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {r["trial_id"]: r for r in _rows(work_dir)}
    assert len(rows) == 4 and {r["status"] for r in rows.values()} == {"TERMINATED"}
    assert sorted(r[LR] for r in rows.values()) == sorted(space[LR]["values"])
    stopped = [r for r in rows.values() if r["stopped_early"]]
    assert stopped, rows
    print(
        f"ASHA sweep: {wall:.0f} s, {len(rows)} trials, {len(stopped)} stopped early, best "
        f"accuracy {max(r['best_accuracy'] for r in rows.values()):.2f}"
    )
    # the table, best first, and the summary on the terminal
    assert "trial_id" in out.stdout and '"stopped_early": ' in out.stdout

    client = _client(mlflow_server)
    parent, children = _children(client, work_dir)
    assert set(children) == set(rows)
    for row in stopped:
        trial = Path(row["work_dir"])
        # after_train ran: the stop was the run's own, its last checkpoint is there and named,
        # its MLflow run ended FINISHED, tagged stopped early, nested under the sweep's
        log = (trial / "logs" / "run.log").read_text()
        assert (
            f"stop at iteration {row['iter']}, requested by: tune: trial stopped or paused by "
            "the scheduler" in log
        )
        run_id = json.loads((trial / "mlflow_run.json").read_text())["run_id"]
        assert f"MLflow run {run_id} (FINISHED)" in log  # the sinks closed: the run ended
        last = (trial / "last_checkpoint").read_text().strip()
        assert (trial / last).is_file() and row["epoch"] < 4
        import torch

        assert torch.load(trial / last, weights_only=False)["meta"]["iter"] == row["iter"]
        child = children[row["trial_id"]]
        assert child.info.status == "FINISHED"
        assert child.data.tags["tune.stopped_early"] == "true"
        assert child.data.tags["mlflow.parentRunId"] == parent
        assert child.data.metrics["val/accuracy"] == pytest.approx(row["final_accuracy"])
    finished = [r for r in rows.values() if not r["stopped_early"]]
    assert all(children[r["trial_id"]].data.tags["tune.stopped_early"] == "false" for r in finished)
    best = max(rows.values(), key=lambda r: r["best_accuracy"])
    parent_run = client.get_run(parent)
    assert parent_run.info.status == "FINISHED"
    assert parent_run.data.metrics["best/accuracy"] == pytest.approx(best["best_accuracy"])
    assert parent_run.data.tags[f"best.{LR}"] == str(best[LR])

    # drun plot of the sweep's work_dir overlays its trials' curves
    from distributed_runner.tracking.plot import build_figure, expand_runs, series

    assert sorted(p.name for p in expand_runs([work_dir])) == sorted(rows)
    assert build_figure(expand_runs([work_dir]))._suptitle.get_text().count(" vs ") == 3
    out = _drun(["plot", str(work_dir)], _env(mlflow_server), timeout=60)
    assert out.returncode == 0 and (work_dir / "curves.png").is_file(), out.stderr[-2000:]

    # best_config.py is an ordinary config with the best values: drun train runs it, and with
    # the trials' thread count (env_cfg.num_threads, the CPUs Ray gave each trial) its losses
    # are the best trial's, bit for bit (on this 2-core machine drun train alone takes 2
    # threads, which changed them from ~1e-7 on)
    best_cfg = work_dir / "best_config.py"
    assert f"'lr': {best[LR]!r}" in best_cfg.read_text()
    assert "env_cfg = {'num_threads': 1}" in best_cfg.read_text()
    out = _drun(
        [
            "train",
            str(best_cfg),
            "--cfg-options",
            "train_cfg.max_epochs=1",
            "default_hooks.logger.sinks=[terminal,jsonl]",
        ],
        _env(mlflow_server),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = (work_dir / "best").iterdir()  # its run's folder
    assert (run / "epoch_1.pth").is_file() or (run / "last.pth").is_file()
    steps, losses = series(run)[("train", "loss")]
    trial_steps, trial_losses = series(Path(best["work_dir"]))[("train", "loss")]
    assert steps == trial_steps[: len(steps)] == [20, 40]
    assert losses == trial_losses[: len(steps)]  # exactly equal
    assert series(run)[("val", "accuracy")][1][0] == series(Path(best["work_dir"]))[
        ("val", "accuracy")][1][0]


PBT = {
    "type": "PBT",
    "perturbation_interval": 1,
    "quantile_fraction": 0.5,
    "resample_probability": 0.0,
    "synch": True,  # every trial reports before PBT decides: the poor one surely exploits
    "hyperparam_mutations": {LR: {"type": "loguniform", "lower": 1e-4, "upper": 3e-2}},
}


@pytest.mark.timeout(240)
def test_pbt_forks_continue_the_donor_with_the_trials_own_lr(ray_cluster, mlflow_server, tmp_path):
    """On the session's cluster (``--address``): the forks are what is tested, a local Ray's
    start is the ASHA test's."""
    import torch

    work_dir = tmp_path / "pbt"
    # a good and a poor learning rate: at every perturbation the poor trial is in the bottom
    # half and exploits the good one
    space = {LR: {"type": "grid_search", "values": [3e-3, 3e-5]}, "model.width": 8}
    start = time.monotonic()
    out = _drun(
        [
            "tune",
            "configs/digits_tune.py",
            "--work-dir",
            str(work_dir),
            "--num-samples",
            "1",
            "--address",
            ray_cluster.get_runtime_context().gcs_address,
            "--cfg-options",
            "train_cfg.max_epochs=3",
            f"tune.param_space={space!r}",
            f"tune.scheduler={PBT!r}",
            SINKS,
        ],
        _env(mlflow_server),
        timeout=200,
    )
    wall = time.monotonic() - start
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {r["trial_id"]: r for r in _rows(work_dir)}
    assert len(rows) == 2 and all(r["status"] == "TERMINATED" for r in rows.values())
    forked = [r for r in rows.values() if r["forks"]]
    pbt_lines = [line for line in (out.stdout + out.stderr).splitlines() if "pbt" in line.lower()]
    assert forked, "PBT exploited no trial:\n" + "\n".join(pbt_lines[-20:])
    print(
        f"PBT sweep: {wall:.0f} s, {len(rows)} trials, {sum(r['forks'] for r in rows.values())} "
        f"exploits, best accuracy {max(r['best_accuracy'] for r in rows.values()):.2f}"
    )
    client = _client(mlflow_server)
    parent, children = _children(client, work_dir)
    assert set(children) == set(rows)
    for row in forked:
        trial = Path(row["work_dir"])
        forks = [json.loads(line) for line in (trial / "tune_forks.jsonl").read_text().splitlines()]
        log = (trial / "logs" / "run.log").read_text()
        for fork in forks:
            old, new = fork["changes"][LR]
            assert fork["donor"] != row["trial_id"] and old != new
            assert (
                f"PBT fork: continuing trial {fork['donor']}'s run from iteration "
                f"{fork['iteration']} with {LR} {old:g} -> {new:g}" in log
            )
        # the mutated rate is the one in force: the trial's last checkpoint, written after its
        # last fork, holds its own rate as the optimizer's base rate (the donor's was `old`)
        last = trial / (trial / "last_checkpoint").read_text().strip()
        ckpt = torch.load(last, weights_only=False)
        assert ckpt["meta"]["iter"] > forks[-1]["iteration"]
        groups = ckpt["optimizer"]["param_groups"]
        assert [g["initial_lr"] for g in groups] == [pytest.approx(forks[-1]["changes"][LR][1])]
        assert row[LR] == pytest.approx(forks[-1]["changes"][LR][1])
        # own checkpoint bookkeeping: max_keep_ckpts=2 goes on counting the trial's own files
        assert len(list(trial.glob("epoch_*.pth"))) <= 2
        # own identity: its own MLflow run (not the donor's), FINISHED, with the forks tagged
        own = json.loads((trial / "mlflow_run.json").read_text())["run_id"]
        child = children[row["trial_id"]]
        assert child.info.run_id == own and child.info.status == "FINISHED"
        donor_run = children[forks[-1]["donor"]].info.run_id
        assert donor_run != own
        assert child.data.tags["tune.fork.0"].startswith(f"from trial {forks[0]['donor']}")
    assert client.get_run(parent).info.status == "FINISHED"


def _wait_for(predicate, timeout: float, proc: subprocess.Popen) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, "drun tune ended before it was interrupted"
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


@pytest.mark.timeout(300)
def test_an_interrupted_sweep_resumes_where_it_stopped(mlflow_server, tmp_path):
    """SIGINT to ``drun tune`` while its second trial trains, then ``drun tune --resume``: the
    finished trial is not rerun, the interrupted one resumes from its checkpoint, and the sweep's
    MLflow parent run is the same."""
    work_dir = tmp_path / "sweep"
    space = {LR: {"type": "grid_search", "values": [3e-3, 1e-2]}}
    args = [
        "tune",
        "configs/digits_tune.py",
        "--work-dir",
        str(work_dir),
        "--max-concurrent-trials",
        "1",
        "--cfg-options",
        "train_cfg.max_epochs=4",  # the example's 12 cost 8 more epochs a trial
        "default_hooks.checkpoint.interval=1",  # the cut trial has a checkpoint to resume
        f"tune.param_space={space!r}",
        "tune.num_samples=1",
        "tune.scheduler=fifo",
        SINKS,
    ]
    env = _env(mlflow_server)
    log = open(tmp_path / "first.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed_runner.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    trials = work_dir / "trials"

    def second_trial_is_training() -> bool:
        done = {p.parent for p in trials.glob("*/epoch_4.pth")}
        started = {p.parent for p in trials.glob("*/epoch_*.pth")} - done
        return bool(done and started)

    try:
        _wait_for(second_trial_is_training, 150, proc)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    first_out = (tmp_path / "first.log").read_text()
    assert code == 130, first_out[-3000:]
    assert "--resume continues the sweep" in first_out
    statuses = json.loads((work_dir / "tune_status.json").read_text())
    assert list(statuses.values()) == ["TERMINATED"]  # the first trial; the second was cut
    done = trials / next(iter(statuses))
    (cut,) = [p for p in trials.iterdir() if p != done and p.is_dir()]
    before = {p.name: p.stat().st_mtime_ns for p in done.iterdir() if p.is_file()}
    parent = (work_dir / "mlflow_sweep.json").read_text()
    cut_run = json.loads((cut / "mlflow_run.json").read_text())["run_id"]

    out = _drun([*args, "--resume"], env, timeout=200)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {r["trial_id"]: r for r in _rows(work_dir)}
    assert {r["epoch"] for r in rows.values()} == {4} and len(rows) == 2
    # the finished trial was not run again; the interrupted one resumed from a checkpoint of
    # its own, into its own MLflow run, under the same parent
    assert {p.name: p.stat().st_mtime_ns for p in done.iterdir() if p.is_file()} == before
    log_text = (cut / "logs" / "run.log").read_text()
    # from the file Tune persisted, or (cut before Tune persisted one) the trial's own newest
    assert f"resumed from {cut}/" in log_text
    assert json.loads((cut / "mlflow_run.json").read_text())["run_id"] == cut_run
    assert (work_dir / "mlflow_sweep.json").read_text() == parent
    client = _client(mlflow_server)
    parent_id, children = _children(client, work_dir)
    assert set(children) == set(rows)
    assert client.get_run(parent_id).info.status == "FINISHED"
    assert all(c.info.status == "FINISHED" for c in children.values())


@pytest.mark.timeout(180)
@pytest.mark.parametrize("searcher", ["optuna", "hyperopt"])
def test_the_optional_searchers_drive_a_sweep(searcher, ray_cluster, tmp_path):
    """``pip install -e '.[tune]'``: optuna and hyperopt suggest the trials' values. On the
    session's cluster (``--address``): the searcher is what is tested, and a local Ray's start
    is the ASHA test's."""
    pytest.importorskip(searcher)
    work_dir = tmp_path / searcher
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p)
    env.pop("RAY_ADDRESS", None)
    out = _drun(
        [
            "tune",
            "configs/digits_tune.py",
            "--work-dir",
            str(work_dir),
            "--search-alg",
            searcher,
            "--address",
            ray_cluster.get_runtime_context().gcs_address,
            "--scheduler",
            "fifo",
            "--num-samples",
            "2",
            "--cfg-options",
            "train_cfg.max_epochs=1",
        ],
        env,
        timeout=150,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"search {searcher}, scheduler fifo" in out.stdout
    rows = _rows(work_dir)
    assert len(rows) == 2 and all(r["status"] == "TERMINATED" and r["epoch"] == 1 for r in rows)
    assert all(1e-4 <= r[LR] <= 3e-2 and int(r["model.width"]) in (8, 16) for r in rows)
