"""TensorBoard and Parquet sinks read back with their own readers; secrets never reach any
output; ``drun plot`` draws the Parquet table."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tests.hook_probes  # noqa: F401 - SignalHook
from distributed_runner.core.redact import REDACTED, flatten, is_secret_key, redact, redact_url
from distributed_runner.tracking.sinks import read_scalars
from tests.toy import ListSink, make_runner

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hunter2-very-secret-value"
SINKS = ["jsonl", "parquet", "tensorboard"]


def train(work_dir, epochs=2, resume=False, **extra):
    runner = make_runner(work_dir, train_cfg=dict(by_epoch=True, max_epochs=epochs),
                         default_hooks=dict(logger=dict(type="LoggerHook", interval=5,
                                                        sinks=SINKS)),
                         resume=resume, **extra)
    runner.train()
    return runner


def test_tensorboard_events_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(tmp_path)
    acc = EventAccumulator(str(tmp_path / "logs" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/time", "val/accuracy"} <= tags
    assert [e.step for e in acc.Scalars("train/loss")] == [5, 10, 15, 20]
    # MMEngine's log_metric_by_epoch=True: validation metrics charted at their epoch
    assert [e.step for e in acc.Scalars("val/accuracy")] == [1, 2]
    assert "config/text_summary" in acc.Tags()["tensors"]
    assert (tmp_path / "logs" / "tensorboard" / "hparams").is_dir()
    lines = [json.loads(line) for line in (tmp_path / "logs" / "scalars.jsonl").open()]
    assert [(r["step"], r["epoch"]) for r in lines if r["mode"] == "val"] == [(10, 1), (20, 2)]

    runner = make_runner(tmp_path / "by_iter", train_cfg=dict(by_epoch=True, max_epochs=2),
                         default_hooks=dict(logger=dict(type="LoggerHook", interval=5,
                                                        sinks=SINKS, log_metric_by_epoch=False)))
    runner.train()
    acc = EventAccumulator(str(tmp_path / "by_iter" / "logs" / "tensorboard"),
                           size_guidance={"scalars": 0}).Reload()
    assert [e.step for e in acc.Scalars("val/accuracy")] == [10, 20]


def test_parquet_table_and_resume_keeps_one_row_per_step(tmp_path):
    first = train(tmp_path, epochs=2)
    losses = first.message_hub.get_scalar("train/loss").values()
    table = read_scalars(tmp_path)
    assert set(table.column_names) >= {"mode", "tag", "step", "epoch", "value", "wall_time"}
    rows = table.to_pylist()
    train_loss = [(r["step"], r["value"]) for r in rows if r["mode"] == "train"
                  and r["tag"] == "loss"]
    assert [s for s, _ in train_loss] == [5, 10, 15, 20]
    assert train_loss[0][1] == sum(losses[:5]) / 5
    # resume from epoch 1 and run to 3: steps 15, 20 are logged again, then 25, 30
    train(tmp_path, epochs=3, resume=str(tmp_path / "epoch_1.pth"))
    rows = read_scalars(tmp_path).to_pylist()
    steps = [r["step"] for r in rows if r["mode"] == "train" and r["tag"] == "loss"]
    assert steps == [5, 10, 15, 20, 25, 30]
    val = [r["step"] for r in rows if r["mode"] == "val" and r["tag"] == "accuracy"]
    assert val == [10, 20, 30]


def test_secrets_never_reach_any_output(tmp_path):
    runner = train(tmp_path, epochs=1,
                   mlflow=dict(tracking_token=SECRET, password=SECRET, api_key=SECRET,
                               server=f"https://drun:{SECRET}@mlflow.example.com:5000"),
                   experiment_name="secret-test")
    assert runner.cfg["mlflow"]["password"] == SECRET  # the run itself still has it
    for path in tmp_path.rglob("*"):
        if path.is_file() and path.suffix != ".pth":
            assert SECRET.encode() not in path.read_bytes(), path
    ckpt = torch.load(tmp_path / "epoch_1.pth", weights_only=True)
    assert SECRET not in ckpt["meta"]["config"]
    assert json.loads(ckpt["meta"]["config"])["mlflow"]["api_key"] == REDACTED
    assert f"'password': '{REDACTED}'" in (tmp_path / "config.py").read_text()
    assert f"https://drun:{REDACTED}@mlflow.example.com:5000" in (tmp_path / "config.py").read_text()


def test_redaction_rules():
    assert all(is_secret_key(k) for k in ("token", "MLFLOW_TRACKING_TOKEN", "password",
                                          "db_passwd", "client_secret", "aws_access_key",
                                          "api_key", "apikey", "key", "credentials"))
    assert not any(is_secret_key(k) for k in ("label_key", "pred_key", "monitor", "keys",
                                              "max_keep_ckpts", "published_keys"))
    # token ids and counts are no secrets (a GPT2Config's bos_token_id was saved as '******')
    assert not any(is_secret_key(k) for k in ("bos_token_id", "pad_token_id", "tokens_key",
                                              "tokens_per_s", "max_tokens", "num_tokens"))
    assert all(is_secret_key(k) for k in ("hf_token", "access_token", "auth_token", "TOKEN"))
    assert redact({"a": {"token": "x", "n": 1}, "l": [{"secret": 2}]}) == \
        {"a": {"token": REDACTED, "n": 1}, "l": [{"secret": REDACTED}]}
    assert flatten({"a": {"b": 1}, "c": [2, 3], "d": []}) == {"a.b": 1, "c.0": 2, "c.1": 3,
                                                              "d": "[]"}
    # credentials inside URLs, whatever the key; the rest of the URL stays readable
    assert redact_url("http://user:pa55@host:5000") == f"http://user:{REDACTED}@host:5000"
    assert redact_url("https://h/p?token=abc&run=1") == f"https://h/p?token={REDACTED}&run=1"
    assert redact_url("see s3://k:s@b/x and http://h:5000") == \
        f"see s3://k:{REDACTED}@b/x and http://h:5000"
    for plain in ("sqlite:////tmp/a.db", "http://127.0.0.1:5000", "databricks://profile:pre"):
        assert redact_url(plain) == plain
    assert redact({"uri": "http://u:p@h", "urls": ["http://u:p@h"]}) == \
        {"uri": f"http://u:{REDACTED}@h", "urls": [f"http://u:{REDACTED}@h"]}


def test_drun_plot_draws_a_default_run_and_overlays_runs(tmp_path):
    from distributed_runner.tracking.plot import build_figure, series

    train(tmp_path / "parquet")  # jsonl + parquet + tensorboard: read from Parquet
    # a default run (jsonl only) that crashed after its epoch-1 checkpoint and was resumed: the
    # steps logged twice are plotted once
    default = dict(logger=dict(type="LoggerHook", interval=5))
    with pytest.raises(RuntimeError):
        make_runner(tmp_path / "default", default_hooks=default,
                    custom_hooks=[dict(type="CrashAtHook", at_iter=17)]).train()
    make_runner(tmp_path / "default", default_hooks=default, resume=True).train()
    data = series(tmp_path / "default")
    assert data[("train", "loss")][0] == [5, 10, 15, 20, 25, 30]
    assert data[("val", "accuracy")][0] == [10, 20, 30]
    assert series(tmp_path / "parquet")[("train", "loss")][0] == [5, 10, 15, 20]

    fig = build_figure([tmp_path / "default", tmp_path / "parquet"], smooth=0.6)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["training loss (smoothed 0.6)", "learning rate", "validation"]
    assert all(ax.get_xlabel() == "iteration" for ax in fig.axes)
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "lr", "metric"]
    loss_axis = fig.axes[0]
    labels = [line.get_label() for line in loss_axis.lines if not line.get_label().startswith("_")]
    assert labels == ["default: train/loss", "parquet: train/loss"]  # one legend entry a run
    # epoch ends of each run (not the last) as vertical lines: steps 10, 20 and 10
    vertical = sorted(line.get_xdata()[0] for line in loss_axis.lines
                      if len(set(line.get_xdata())) == 1 and len(line.get_xdata()) == 2)
    assert vertical == [10, 10, 20]
    assert fig._suptitle.get_text() == "default vs parquet"

    out = subprocess.run([sys.executable, "-m", "distributed_runner.cli", "plot",
                          str(tmp_path / "default"), str(tmp_path / "parquet"), "--smooth",
                          "0.6", "--out", str(tmp_path / "c.png")], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    png = (tmp_path / "c.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    for args, fragment in (([str(tmp_path / "nothing")], "no run with logs in"),
                           ([str(tmp_path / "default"), "--smooth", "1.5"], "--smooth: 1.5")):
        bad = subprocess.run([sys.executable, "-m", "distributed_runner.cli", "plot", *args],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert bad.returncode == 2 and fragment in bad.stderr, bad.stderr


def test_terminal_progress_bar_on_a_tty_plain_lines_otherwise(tmp_path):
    import io

    from rich.console import Console

    from distributed_runner.tracking.sinks import TerminalSink

    screen = io.StringIO()
    bar = TerminalSink(progress=True, console=Console(file=screen, force_terminal=True,
                                                      width=120))
    runner = make_runner(tmp_path / "bar", train_cfg=dict(by_epoch=True, max_epochs=2),
                         log_level="INFO",
                         default_hooks=dict(logger=dict(type="LoggerHook", interval=5,
                                                        sinks=[bar])))
    runner.train()
    shown = screen.getvalue()
    assert "20/20" in shown and "loss:" in shown and "Epoch(val) [2]" in shown
    log = (tmp_path / "bar" / "logs" / "run.log").read_text()
    assert "Epoch(train) [2][10/10]" in log  # the file still gets the plain lines
    plain = TerminalSink()  # 'auto' under pytest: stdout is not a TTY
    runner = make_runner(tmp_path / "plain", train_cfg=dict(by_epoch=True, max_epochs=1),
                         log_level="INFO",
                         default_hooks=dict(logger=dict(type="LoggerHook", interval=5,
                                                        sinks=[plain])))
    runner.train()
    assert plain._bar is None
    assert "Epoch(train) [1][ 5/10]" in (tmp_path / "plain" / "logs" / "run.log").read_text()


class OutcomeSink(ListSink):
    """Records the outcome the Runner tells its sinks before closing them."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: list = []

    def finish(self, outcome: str) -> None:
        self.outcomes.append((outcome, self.closed))


def test_sinks_are_told_how_the_run_ended(tmp_path):
    from distributed_runner.core.preemption import TrainingPreempted

    def run(name, hooks):
        sink = OutcomeSink()
        runner = make_runner(tmp_path / name, custom_hooks=hooks, default_hooks=dict(
            logger=dict(type="LoggerHook", interval=5, sinks=[sink])))
        return sink, runner

    sink, runner = run("ok", [])
    runner.train()
    assert sink.outcomes == [("FINISHED", False)] and sink.closed  # told, then closed
    sink, runner = run("crash", [dict(type="CrashAtHook", at_iter=7)])
    with pytest.raises(RuntimeError, match="simulated crash"):
        runner.train()
    assert sink.outcomes == [("FAILED", False)] and sink.closed
    sink, runner = run("preempted", [dict(type="SignalHook", at_iter=7)])
    with pytest.raises(TrainingPreempted):
        runner.train()
    assert sink.outcomes == [("KILLED", False)] and sink.closed
