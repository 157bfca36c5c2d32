"""A password in a URI is never printed nor stored (issue 40): redaction where lines leave the
process, whoever wrote them — the project, MLflow's client quoting its request URL, pyarrow
quoting an endpoint, Ray — not at each call site.

Each case runs ``drun train`` (the user's path: its terminal is the one redacted) with a known
password in one place a user may put one, drives the error path that quotes it, and looks for
the password in the terminal, in every file of the work_dir (the run log, JSON lines, the config
dump, checkpoints and their meta) and, where a server answered, in the MLflow run.
"""
import http.server
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from tests.toy import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow("a real mlflow server and drun subprocesses")]

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "pw-" + uuid.uuid4().hex
# MLflow's client as a user would set it to give up quickly on a server that is not there
QUICK_MLFLOW = dict(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="5")


class Refusing(http.server.BaseHTTPRequestHandler):
    """Answers 401 and 403 in turn, as a server behind basic auth does to a wrong password (or
    a user without the permission); ``answered`` counts the requests."""

    answered = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        type(self).answered += 1
        self.send_response(401 if type(self).answered % 2 else 403)
        self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def write_config(tmp_path, sinks=("terminal", "jsonl"), checkpoint=None, **extra):
    """One epoch of the toy model, the given logger sinks and CheckpointHook arguments."""
    cfg = tmp_path / "cfg.py"
    cfg.write_text(
        "from tests.toy import base_cfg\n"
        f"globals().update(base_cfg({str(tmp_path / 'wd')!r}, log_level='INFO',\n"
        "    train_cfg=dict(by_epoch=True, max_epochs=1),\n"
        f"    default_hooks=dict(logger=dict(type='LoggerHook', interval=5, sinks={list(sinks)!r}),\n"
        f"                       checkpoint=dict(type='CheckpointHook', interval=1, **{checkpoint or {}!r})),\n"
        f"    **{extra!r}))\n")
    return cfg


def drun(cfg, *args, env=None, timeout=180):
    done = subprocess.run(
        [sys.executable, "-m", "distributed_runner.cli", "train", str(cfg), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT), **QUICK_MLFLOW, **(env or {})})
    return done.returncode, done.stdout + done.stderr


def assert_nowhere(out, work_dir, quoted):
    """The password is in no terminal line and no file; ``quoted`` (the redacted form of what
    the error quoted) shows that the error path was really taken."""
    assert PASSWORD not in out, out[-2000:]
    assert quoted in out, out[-2000:]
    for path in Path(work_dir).rglob("*"):
        if path.is_file():
            assert PASSWORD.encode() not in path.read_bytes(), path


def mlflow_sink(uri):
    return dict(type="MLflowSink", tracking_uri=uri, close_timeout=2)


def test_mlflow_down_and_an_s3_endpoint_unreachable_with_keys_in_its_url(tmp_path):
    """One run, two stores out of reach: the MLflow server (its URI holds the password) and the
    remote out_dir's S3 endpoint (AWS_ENDPOINT_URL holds the keys, as do the AWS variables)."""
    uri = f"http://drun:{PASSWORD}@127.0.0.1:{free_port()}"
    endpoint = f"http://AKIAEXAMPLE:{PASSWORD}@127.0.0.1:{free_port()}"
    cfg = write_config(tmp_path, sinks=["terminal", "jsonl", mlflow_sink(uri)],
                       checkpoint=dict(out_dir="s3://drun-bucket/runs"))
    code, out = drun(cfg, env=dict(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="AKIAEXAMPLE",
                                   AWS_SECRET_ACCESS_KEY=PASSWORD, AWS_EC2_METADATA_DISABLED="true"))
    assert code == 0, out[-2000:]
    # the project's warning and the MlflowException it quotes (its request URL) both masked
    assert_nowhere(out, tmp_path / "wd", "API request to http://drun:******@127.0.0.1:")
    assert "copies to out_dir s3://drun-bucket/runs/wd failed" in out


def test_mlflow_refusing_the_password(tmp_path, refusing_server):
    uri = refusing_server.replace("http://", f"http://drun:{PASSWORD}@")
    code, out = drun(write_config(tmp_path, sinks=["terminal", "jsonl", mlflow_sink(uri)]))
    assert code == 0, out[-2000:]
    assert Refusing.answered >= 2  # a 401 and a 403 at least
    assert_nowhere(out, tmp_path / "wd", f"http://drun:******@{refusing_server[7:]}")


def test_remote_out_dir_with_a_secret_in_its_uri(tmp_path):
    port = free_port()
    out_dir = (f"s3://drun-bucket/runs?scheme=http&endpoint_override=127.0.0.1:{port}"
               f"&access_key=AKIAEXAMPLE&secret_key={PASSWORD}")
    code, out = drun(write_config(tmp_path, checkpoint=dict(out_dir=out_dir)),
                     env=dict(AWS_EC2_METADATA_DISABLED="true"))
    assert_nowhere(out, tmp_path / "wd", "secret_key=******")


def test_ray_address_with_a_token(tmp_path):
    address = f"ray://drun:{PASSWORD}@127.0.0.1:{free_port()}"
    code, out = drun(write_config(tmp_path), "--launcher", "ray", "--num-workers", "1",
                     "--cfg-options", f"launcher.address={address}", timeout=120)
    assert code == 2, out[-2000:]
    assert_nowhere(out, tmp_path / "wd", "drun:******@127.0.0.1")


def test_secrets_in_the_config_reach_no_mlflow_param_or_tag(tmp_path, mlflow_server):
    """A live server: the run is logged, and neither a secret-looking key nor a URL with a
    password anywhere in the config arrives in its params or tags (nor the terminal, nor the
    checkpoints' config dump)."""
    from mlflow.tracking import MlflowClient

    name = f"redaction-{uuid.uuid4().hex[:6]}"
    cfg = write_config(tmp_path, sinks=["terminal", "jsonl", mlflow_sink(mlflow_server.uri)],
                       experiment_name=name,
                       dataset_note=dict(api_key=PASSWORD,
                                         mirror=f"https://reader:{PASSWORD}@data.example/x"))
    code, out = drun(cfg)
    assert code == 0, out[-2000:]
    assert_nowhere(out, tmp_path / "wd", "MLflow")
    client = MlflowClient(mlflow_server.uri)
    runs = client.search_runs([client.get_experiment_by_name(name).experiment_id])
    assert len(runs) == 1
    data = runs[0].data
    assert data.params and PASSWORD not in str(data.params) + str(data.tags)
    assert data.params.get("dataset_note.api_key") == "******"
