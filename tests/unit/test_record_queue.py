"""Training records written a second later in a batch (sinks/record_queue.py) keep the log's
order, its content and its timestamps, lose nothing a crash did not lose before, and are all on
disk before ``after_run`` returns."""
from __future__ import annotations

import json
import re
import threading
import time

import pytest

import tests.toy  # noqa: F401  (ToyDataset / ToyModel)
from distributed_runner import Runner
from distributed_runner.core.registry import LOG_SINKS
from distributed_runner.tracking.sinks import LogSink
from hooks import Hook
from tests.toy import base_cfg


class Marker(Hook):
    """After every 3rd iteration (after LoggerHook's record), a line of its own."""

    priority = "LOWEST"

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if (runner.iter + 1) % 3 == 0:
            runner.logger.warning("marker after iteration %d", runner.iter + 1)


class FilesAtAfterRun(Hook):
    """Reads the JSON lines at the very end of ``after_run``."""

    priority = "LOWEST"

    def __init__(self) -> None:
        self.steps: list[int] = []

    def after_run(self, runner) -> None:
        path = runner.work_dir / "logs" / "scalars.jsonl"
        self.steps = [json.loads(line)["step"] for line in path.read_text().splitlines()
                      if '"train"' in line]


@LOG_SINKS.register_module(force=True)
class ThreadNotingSink(LogSink):
    """Which thread wrote each record, and when the record was made."""

    got: list = []

    def write(self, record) -> None:
        ThreadNotingSink.got.append((record.mode, record.step, record.created,
                                     threading.current_thread().name, time.time()))


def test_lines_keep_their_order_with_other_messages_and_their_own_time(tmp_path):
    ThreadNotingSink.got = []
    cfg = base_cfg(tmp_path, custom_hooks=[Marker()], log_level="INFO")
    cfg["train_cfg"] = dict(by_epoch=True, max_epochs=2, val_interval=1)
    cfg["default_hooks"] = dict(logger=dict(type="LoggerHook", interval=1,
                                            sinks=["terminal", "jsonl", "ThreadNotingSink"]))
    Runner.from_cfg(cfg).train()
    lines = (tmp_path / "logs" / "run.log").read_text().splitlines()
    train = [i for i, line in enumerate(lines) if "Epoch(train)" in line]
    assert len(train) == 20
    for n in range(3, 21, 3):  # each marker comes right after the line of its iteration
        epoch, k = (n - 1) // 10 + 1, (n - 1) % 10 + 1
        marker = next(i for i, line in enumerate(lines) if f"marker after iteration {n}" in line)
        assert re.search(rf"Epoch\(train\) \[{epoch}\]\[\s*{k}/10\]", lines[marker - 1]), \
            lines[marker - 2:marker + 1]
    vals = [i for i, line in enumerate(lines) if "Epoch(val)" in line]
    assert len(vals) == 2 and train[9] < vals[0] < train[10]  # validation after epoch 1's lines
    records = ThreadNotingSink.got
    assert [(m, s) for m, s, *_ in records if m == "train"] == [("train", s) for s in
                                                                 range(1, 21)]
    # made in order on the training thread; the record's own time, not the writer's
    created = [c for m, _, c, *_ in records]
    assert created == sorted(created)
    assert all(wrote >= made for _, _, made, _, wrote in records)


def test_every_record_is_in_the_files_before_after_run_returns(tmp_path):
    at_end = FilesAtAfterRun()  # nothing else logs: the queue is written by the writer or the end
    cfg = base_cfg(tmp_path, custom_hooks=[at_end], log_level="WARNING")
    cfg["val_dataloader"] = cfg["val_evaluator"] = cfg["val_cfg"] = None
    cfg["default_hooks"] = dict(logger=dict(type="LoggerHook", interval=1, sinks=["jsonl"]),
                                checkpoint=None)  # a checkpoint would write them itself
    Runner.from_cfg(cfg).train()
    assert at_end.steps == list(range(1, 31))


def test_a_crash_writes_every_record_made_before_it(tmp_path):
    class Crash(Hook):
        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
            if runner.iter == 13:
                raise RuntimeError("boom")

    cfg = base_cfg(tmp_path, custom_hooks=[Crash()])
    cfg["default_hooks"] = dict(logger=dict(type="LoggerHook", interval=1, sinks=["jsonl"]))
    with pytest.raises(RuntimeError, match="boom"):
        Runner.from_cfg(cfg).train()
    lines = (tmp_path / "logs" / "scalars.jsonl").read_text().splitlines()
    # LoggerHook (BELOW_NORMAL) runs after Crash (NORMAL): iteration 14's record was never made
    assert [json.loads(line)["step"] for line in lines if '"train"' in line] == list(range(1, 14))


def test_queued_lines_reach_the_file_within_about_a_second_while_training_goes_on(tmp_path):
    from distributed_runner.tracking.sinks.record_queue import WRITE_SECONDS

    seen_after: list[float] = []

    class Watch(Hook):
        """Waits in the 2nd epoch until the 1st epoch's lines are in run.log."""

        def before_train_epoch(self, runner) -> None:
            if runner.epoch == 1:
                path, start = runner.work_dir / "logs" / "run.log", time.monotonic()
                while "[1][10/10]" not in path.read_text() and time.monotonic() - start < 10:
                    time.sleep(0.01)
                seen_after.append(time.monotonic() - start)

    cfg = base_cfg(tmp_path, custom_hooks=[Watch()], log_level="INFO")
    cfg["val_dataloader"] = cfg["val_evaluator"] = cfg["val_cfg"] = None
    cfg["train_cfg"] = dict(by_epoch=True, max_epochs=2)
    cfg["default_hooks"] = dict(logger=dict(type="LoggerHook", interval=5,
                                            sinks=["terminal"]), checkpoint=None)
    Runner.from_cfg(cfg).train()
    assert seen_after and seen_after[0] < WRITE_SECONDS + 1.5  # the writer thread wrote them
