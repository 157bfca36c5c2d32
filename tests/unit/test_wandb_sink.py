"""The wandb sink in W&B's offline mode (no server): what the run file wandb itself wrote holds —
history with each mode's step metric, the config, the exit code — one run across a crash and a
resume, and the one-line errors."""
import json
import sys
import time
from pathlib import Path

import pytest

import tests.hook_probes  # noqa: F401 - CrashAtHook
from distributed_runner.core.errors import ConfigError
from tests.toy import make_runner

pytest.importorskip("wandb")
BLOCK, HEADER = 32768, 7  # the .wandb file: W&B's LevelDB-log framing


def wandb_records(path: Path) -> list:
    """The protobuf records of a ``run-<id>.wandb`` file (header ``:W&B``, then LevelDB-log
    blocks of 32 KiB whose records are FULL / FIRST / MIDDLE / LAST chunks)."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    pos, chunks, records = HEADER, b"", []
    while pos + HEADER <= len(raw):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = int.from_bytes(raw[pos + 4:pos + 6], "little"), raw[pos + 6]
        if pos + HEADER + length > len(raw):  # the writer is still writing this record
            break
        data, pos = raw[pos + HEADER:pos + HEADER + length], pos + HEADER + length
        chunks = data if kind in (1, 2) else chunks + data
        if kind in (1, 4) and chunks:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
    return records


def run_records(run_dir: Path, seconds: float = 30.0) -> list:
    """The records of the run in ``run_dir`` once its exit record is there: ``run.finish()``
    can return before W&B's service process has written the file (read at once, a resumed run's
    file held no records yet, 1 time in ~10 here; a CI run read a record half written)."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + seconds
    while True:
        (path,) = run_dir.glob("run-*.wandb")
        try:
            records = wandb_records(path)
        except DecodeError:  # a record's bytes still arriving; an error once the time is up
            if time.monotonic() > deadline:
                raise
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) \
                or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def history(run_dir: Path) -> list[dict]:
    return [{item.key or "/".join(item.nested_key): json.loads(item.value_json)
             for item in r.history.item}
            for r in run_records(run_dir) if r.WhichOneof("record_type") == "history"]


def exit_codes(run_dir: Path) -> list[int]:
    return [r.exit.exit_code for r in run_records(run_dir)
            if r.WhichOneof("record_type") == "exit"]


def run_id(run_dir: Path) -> str:
    return next(r.run.run_id for r in run_records(run_dir)
                if r.WhichOneof("record_type") == "run")


def runs(work_dir: Path) -> list[Path]:
    return sorted((work_dir / "wandb").glob("offline-run-*"))


WANDB = dict(type="wandb", mode="offline", project="toy")


def train(work_dir, sink=WANDB, **extra):
    return make_runner(work_dir, default_hooks=dict(
        logger=dict(type="LoggerHook", interval=5, sinks=["jsonl", sink]),
        checkpoint=dict(type="CheckpointHook", interval=1)), **extra)


def test_an_offline_run_holds_every_record_at_its_steps_and_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(tmp_path).train()
    (run_dir,) = runs(tmp_path)
    rows = history(run_dir)
    train_rows = [r for r in rows if "train/loss" in r]
    assert [r["train/step"] for r in train_rows] == [5, 10, 15, 20, 25, 30]
    val_rows = [r for r in rows if "val/accuracy" in r]
    assert [r["val/step"] for r in val_rows] == [1, 2, 3]  # log_metric_by_epoch: epochs
    jsonl = [json.loads(line) for line in (tmp_path / "logs" / "scalars.jsonl").open()]
    assert [r["val/accuracy"] for r in val_rows] == \
        [r["accuracy"] for r in jsonl if r["mode"] == "val"]
    saved_id = json.loads((tmp_path / "wandb_run.json").read_text())["run_id"]
    assert run_id(run_dir) == saved_id and exit_codes(run_dir) == [0]
    configs = [str(getattr(r, kind)) for r in run_records(run_dir)
               if (kind := r.WhichOneof("record_type")) in ("run", "config")]
    assert any('ToyModel' in c and 'optim_wrapper' in c for c in configs)


def test_a_crashed_run_is_resumed_into_the_same_wandb_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(tmp_path, custom_hooks=[dict(type="CrashAtHook", at_iter=17)]).train()
    first_id = json.loads((tmp_path / "wandb_run.json").read_text())["run_id"]
    (crashed,) = runs(tmp_path)
    assert exit_codes(crashed) == [1]  # failed, not finished
    train(tmp_path, resume=True).train()
    resumed = [r for r in runs(tmp_path) if r != crashed]
    assert len(resumed) == 1 and run_id(resumed[0]) == run_id(crashed) == first_id
    steps = [r["train/step"] for r in history(resumed[0]) if "train/loss" in r]
    assert steps == [15, 20, 25, 30]  # from the epoch-1 checkpoint (step 10) on
    assert exit_codes(resumed[0]) == [0]


def test_without_the_package_or_with_a_clashing_argument_it_is_one_line(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"init_kwargs.project: set by the sink"):
        train(tmp_path, sink=dict(WANDB, init_kwargs=dict(project="x")))
    with pytest.raises(ConfigError, match=r"mode: 'ofline': use 'online', 'offline' or"):
        train(tmp_path, sink=dict(WANDB, mode="ofline"))
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"^default_hooks.logger.sinks\[1\]: the wandb sink "
                                          r"needs the wandb package: pip install wandb \(or the "
                                          r"project's extra: pip install -e '.\[wandb\]'\)$"):
        train(tmp_path)


def test_an_online_run_without_a_login_warns_once_and_training_goes_on(tmp_path, monkeypatch,
                                                                       caplog):
    import wandb

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no stored key
    calls = []
    real_init = wandb.init
    monkeypatch.setattr(wandb, "init", lambda *a, **k: calls.append(1) or real_init(*a, **k))
    runner = train(tmp_path, sink=dict(type="wandb", mode="online", project="toy"))
    runner.train()  # no API key: wandb.init raises; the sink is skipped, training finishes
    assert runner.iter == 30 and len(calls) == 1  # not retried at every record
    warnings = [r.getMessage() for r in caplog.records if "sink WandbSink failed" in
                r.getMessage()]
    assert len(warnings) == 1 and "API key" in warnings[0]
    jsonl = (tmp_path / "logs" / "scalars.jsonl").read_text().splitlines()
    assert len(jsonl) == 6 + 3  # the other sink got every record
