"""LoggerHook + sinks, RuntimeInfoHook, IterTimerHook and the MessageHub."""
import json

import torch

from distributed_runner.message_hub import HistoryBuffer, MessageHub
from distributed_runner.sinks import LogRecord
from distributed_runner.sinks.terminal import format_record
from tests.toy import ListSink, make_runner


def test_logger_interval_records_and_jsonl(tmp_path):
    sink = ListSink()
    runner = make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=2),
                         default_hooks=dict(logger=dict(type="LoggerHook", interval=4,
                                                        sinks=["jsonl", sink])))
    runner.train()
    train = [r for r in sink.records if r.mode == "train"]
    # 10 iterations an epoch, interval 4: batches 4 and 8 of each epoch (ignore_last)
    assert [r.step for r in train] == [4, 8, 14, 18]
    assert {"loss", "acc", "lr", "time", "data_time"} <= set(train[0].scalars)
    assert [r.mode for r in sink.records].count("val") == 2 and sink.closed
    lines = [json.loads(x) for x in (tmp_path / "logs" / "scalars.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["mode"] == "train"] == [4, 8, 14, 18]
    assert all("accuracy" in x for x in lines if x["mode"] == "val")
    # smoothed over the interval: the logged loss is the mean of iterations 5..8
    losses = runner.message_hub.get_scalar("train/loss").values()
    assert train[1].scalars["loss"] == sum(losses[4:8]) / 4


def test_ignore_last_false_logs_the_epoch_tail(tmp_path):
    sink = ListSink()
    make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=1),
                default_hooks=dict(logger=dict(type="LoggerHook", interval=4, ignore_last=False,
                                               sinks=[sink]))).train()
    assert [r.step for r in sink.records if r.mode == "train"] == [4, 8, 10]


def test_terminal_line_format():
    rec = LogRecord("train", 14, 2, {"loss": 0.5, "lr": 0.01, "time": 0.1},
                    {"by_epoch": True, "iter_in_epoch": 4, "epoch_length": 10, "eta": 75})
    assert format_record(rec) == ("Epoch(train) [2][ 4/10]  eta: 0:01:15  lr: 1.0000e-02  "
                                  "time: 0.1000  loss: 0.5000")
    it = LogRecord("train", 20, 1, {"loss": 1.0}, {"by_epoch": False, "max_iters": 100})
    assert format_record(it).startswith("Iter(train) [ 20/100]")


def test_runtime_info_and_timer_fill_the_hub(tmp_path):
    runner = make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=1))
    runner.train()
    hub = runner.message_hub
    assert hub.get_info("max_iters") == 10 and hub.get_info("iter") == 9
    assert len(hub.get_scalar("train/time")) == 10 and hub.get_info("eta") == 0
    assert len(hub.get_scalar("train/loss")) == 10
    assert 0 <= hub.get_scalar("val/accuracy").current() <= 100


def test_history_buffer_reads_tensors_lazily_and_round_trips():
    buf = HistoryBuffer(max_length=3)
    for v in [torch.tensor(1.0), 2.0, torch.tensor(3.0), 4.0]:
        buf.update(v)
    assert buf.values() == [2.0, 3.0, 4.0] and buf.mean(2) == 3.5 and buf.current() == 4.0
    hub = MessageHub()
    hub.update_scalar("a", torch.tensor(5.0))
    hub.update_info("epoch", 3)
    again = MessageHub()
    again.load_state_dict(hub.state_dict())
    assert again.get_scalar("a").current() == 5.0 and again.get_info("epoch") == 3
