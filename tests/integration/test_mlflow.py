"""A real ``mlflow server`` (SQLite, 127.0.0.1): one run per training run, whole — params,
continuous metrics, checkpoint artifacts — through a resume, a server outage and Ray."""
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

import tests.hook_probes  # noqa: F401 - CrashAtHook
from distributed_runner import Config, Runner
from distributed_runner.launch.launcher import RayLauncher, normalize_launcher
from hooks import HOOKS, Hook
from tests.toy import base_cfg

pytestmark = [pytest.mark.integration, pytest.mark.slow("a real mlflow server and runs logging to it"),
              pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def mlflow_sink(server, **extra):
    return dict(type="MLflowSink", tracking_uri=server.uri, **extra)


def runs_of(server, experiment):
    client = MlflowClient(server.uri)
    exp = client.get_experiment_by_name(experiment)
    return client, ([] if exp is None else client.search_runs([exp.experiment_id]))


def steps(client, run_id, key):
    return [m.step for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_digits_example_logs_params_metrics_and_checkpoints(mlflow_server, tmp_path):
    name = f"digits-{uuid.uuid4().hex[:6]}"
    cfg = Config.fromfile(ROOT / "configs" / "digits_cnn.py", cfg_options=[
        f"work_dir={tmp_path}", "train_cfg.max_epochs=3", f"experiment_name={name}"])
    cfg.default_hooks.logger.sinks = ["terminal", mlflow_sink(mlflow_server)]
    cfg.default_hooks.checkpoint.published_keys = ["meta", "state_dict"]
    cfg.custom_hooks = [dict(type="MLflowCheckpointHook"),
                        dict(type="VisualizationHook", interval=3, max_images=8)]
    cfg.storage = dict(access_token="tok-123-do-not-log")
    Runner.from_cfg(cfg).train()
    client, runs = runs_of(mlflow_server, name)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params["model.type"] == "DigitsCNN"
    assert run.data.params["optim_wrapper.optimizer.lr"] == "0.003"
    assert run.data.params["storage.access_token"] == "******"
    assert "tok-123-do-not-log" not in str(run.data.params)
    assert run.data.tags["world_size"] == "1" and run.data.tags["launcher"] == "none"
    assert steps(client, run.info.run_id, "train/loss") == [20, 40, 65, 85, 110, 130]
    # named after the run (the experiment and the run's folder), tagged with the config's commit
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert run.info.run_name == f"{name}-{folder.name}"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    assert run.data.tags["git_commit"] == head
    assert steps(client, run.info.run_id, "val/accuracy") == [1, 2, 3]  # epochs: log_metric_by_epoch
    artifacts = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert "last.pth" in artifacts and any(a.startswith("best_accuracy_epoch_") for a in artifacts)
    assert any(a.startswith("last-") for a in artifacts)  # the published one
    images = [Path(a.path).name for a in client.list_artifacts(run.info.run_id, "visualizations")]
    assert images == ["val_iter_135.png"]  # every 3rd validation: the last of 3


def test_interrupted_and_resumed_run_is_one_run_with_continuous_steps(mlflow_server, tmp_path):
    name = f"resume-{uuid.uuid4().hex[:6]}"
    hooks = dict(logger=dict(type="LoggerHook", interval=2, sinks=[mlflow_sink(mlflow_server)]),
                 checkpoint=dict(type="CheckpointHook", interval=1))
    cfg = base_cfg(tmp_path, default_hooks=hooks, experiment_name=name,
                   custom_hooks=[dict(type="CrashAtHook", at_iter=17)])
    with pytest.raises(RuntimeError, match="simulated crash"):
        Runner.from_cfg(cfg).train()
    client, runs = runs_of(mlflow_server, name)
    assert [r.info.status for r in runs] == ["FAILED"]  # not FINISHED: it raised
    # the crashed run logged steps 12..16 after its last checkpoint (epoch 1 = step 10)
    cfg = base_cfg(tmp_path, default_hooks=hooks, experiment_name=name, resume=True)
    Runner.from_cfg(cfg).train()
    client, runs = runs_of(mlflow_server, name)
    assert len(runs) == 1
    run_id = runs[0].info.run_id
    assert steps(client, run_id, "train/loss") == list(range(2, 31, 2))  # no gap, no duplicate
    assert steps(client, run_id, "val/accuracy") == [1, 2, 3]
    assert runs[0].info.status == "FINISHED"
    # opening the run (the sender starts, imports MLflow, creates or adopts it: seconds) does not
    # stall a step — before, the record at step 2 (and 12, after the resume) showed the wait as
    # its step time; the times MLflow charts now are the real ones (a few ms here)
    for key in ("train/time", "train/data_time"):
        history = client.get_metric_history(run_id, key)
        assert len(history) == 15 and max(m.value for m in history) < 0.5, \
            [(m.step, round(m.value, 3)) for m in history]


@HOOKS.register_module(force=True)
class ServerOutageHook(Hook):
    """Stops the server after iteration ``stop_at`` and starts it again in the background."""

    def __init__(self, server, stop_at: int) -> None:
        self.server, self.stop_at = server, stop_at
        self.restarter = None

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.stop_at:
            self.server.stop()
            self.restarter = threading.Thread(target=lambda: (time.sleep(2),
                                                              self.server.start(wait=False)))
            self.restarter.start()


def test_server_outage_mid_run_training_finishes_and_metrics_arrive(mlflow_server, tmp_path,
                                                                    caplog):
    name = f"outage-{uuid.uuid4().hex[:6]}"
    outage = ServerOutageHook(mlflow_server, stop_at=6)
    cfg = base_cfg(tmp_path, experiment_name=name, custom_hooks=[outage],
                   default_hooks=dict(logger=dict(type="LoggerHook", interval=2, sinks=[
                       mlflow_sink(mlflow_server, close_timeout=150)])))
    start = time.perf_counter()
    Runner.from_cfg(cfg).train()  # waits at the end, up to close_timeout, for the server
    outage.restarter.join()
    mlflow_server.wait_healthy()
    client, runs = runs_of(mlflow_server, name)
    assert len(runs) == 1
    assert steps(client, runs[0].info.run_id, "train/loss") == list(range(2, 31, 2))
    assert time.perf_counter() - start < 200


def test_under_ray_a_worker_death_still_makes_one_whole_run_logged_by_rank_0(
        ray_cluster, mlflow_server, tmp_path):
    """Rank 0 (the one talking to MLflow) dies mid-epoch 2; Ray restarts the group from the
    epoch-1 checkpoint. MLflow holds one run: every step once, FINISHED, and as artifacts only
    what the finished run kept."""
    name = f"ray-{uuid.uuid4().hex[:6]}"
    cfg = base_cfg(tmp_path, experiment_name=name,
                   custom_imports=dict(imports=["tests.ray_probe"]),
                   launcher=dict(type="ray", num_workers=2, max_failures=1),
                   custom_hooks=[dict(type="DieOnceHook", at_iter=8, rank=0),
                                 dict(type="MLflowCheckpointHook")],
                   default_hooks=dict(logger=dict(type="LoggerHook", interval=2,
                                                  sinks=[mlflow_sink(mlflow_server)]),
                                      checkpoint=dict(type="CheckpointHook", interval=1,
                                                      max_keep_ckpts=1)))
    assert RayLauncher(cfg, normalize_launcher(cfg["launcher"])).train() == 0
    assert (tmp_path / "died_once").is_file()
    client, runs = runs_of(mlflow_server, name)
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["world_size"] == "2" and run.data.tags["launcher"] == "ray"
    assert run.data.tags["ray_run_name"] == tmp_path.name and run.data.tags["ray_job_id"]
    # 20 samples per rank, batch 4: 5 iterations an epoch; batches 2 and 4 of each are logged —
    # the dead attempt's steps after its checkpoint were logged again by the restart, once
    assert steps(client, run.info.run_id, "train/loss") == [2, 4, 7, 9, 12, 14]
    assert steps(client, run.info.run_id, "val/accuracy") == [1, 2, 3]
    artifacts = {Path(a.path).name for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert artifacts == {"epoch_3.pth"}  # the kept checkpoint, no leftovers of the dead attempt


def test_a_password_in_the_tracking_uri_is_never_shown_or_stored(mlflow_server, tmp_path, capfd):
    """``http://user:PASSWORD@host`` works (the password is sent) but appears in no terminal
    line (the sender's included), no work_dir file, no MLflow param or tag."""
    password = "pw-" + uuid.uuid4().hex
    uri = mlflow_server.uri.replace("http://", f"http://drun:{password}@")
    name = f"secret-uri-{uuid.uuid4().hex[:6]}"
    cfg = base_cfg(tmp_path, experiment_name=name, log_level="INFO",
                   train_cfg=dict(by_epoch=True, max_epochs=1),
                   default_hooks=dict(logger=dict(type="LoggerHook", interval=5, sinks=[
                       "terminal", "jsonl", mlflow_sink(mlflow_server)])))
    cfg["default_hooks"]["logger"]["sinks"][2]["tracking_uri"] = uri
    Runner.from_cfg(cfg).train()
    out, err = capfd.readouterr()
    assert password not in out + err
    assert f"drun:******@127.0.0.1:{mlflow_server.port}/#/experiments/" in out + err  # the link
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert password.encode() not in path.read_bytes(), path
    client, runs = runs_of(mlflow_server, name)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert password not in str(runs[0].data.params) + str(runs[0].data.tags)


def test_a_plain_script_without_a_main_guard_trains_once_and_logs(mlflow_server, tmp_path):
    """Scripts and notebooks rarely have ``if __name__ == "__main__":``. The sender process must
    not re-run the script (it did: the script trained twice and the sender failed to start)."""
    name = f"script-{uuid.uuid4().hex[:6]}"
    script = tmp_path / "train_me.py"
    script.write_text(
        "from distributed_runner import Config, Runner\n"
        "from tests.toy import base_cfg\n"
        f"cfg = base_cfg({str(tmp_path / 'wd')!r}, default_hooks=dict(logger=dict(\n"
        "    type='LoggerHook', interval=1, sinks=['terminal', 'MLflowSink'])))\n"
        "Runner.from_cfg(Config(cfg)).train()\n"
        "print('TRAINED')\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": mlflow_server.uri,
           "MLFLOW_EXPERIMENT_NAME": name}
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, timeout=150,
                          capture_output=True, text=True)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert out.count("TRAINED") == 1 and "bootstrapping" not in out
    client, runs = runs_of(mlflow_server, name)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert steps(client, runs[0].info.run_id, "train/loss") == list(range(1, 31))
