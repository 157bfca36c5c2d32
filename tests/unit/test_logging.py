"""LoggerHook + sinks, RuntimeInfoHook, IterTimerHook and the MessageHub."""
import json
import time

import torch

from distributed_runner.engine.message_hub import HistoryBuffer, MessageHub
from distributed_runner.tracking.sinks import LogRecord
from distributed_runner.tracking.sinks.terminal import format_record
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
    # one prepared template per key set: braces in a key, an int, nan, an lr group
    odd = LogRecord("train", 3, 1, {"a{b}": 1.5, "count": 3, "lr_group1": 1e-3,
                                    "x": float("nan")}, {"by_epoch": False, "max_iters": 10})
    assert format_record(odd) == ("Iter(train) [ 3/10]  a{b}: 1.5000  count: 3  "
                                  "lr_group1: 1.0000e-03  x: nan")
    odd.scalars["count"] = 3.0  # all floats now: the template's way, same text
    assert format_record(odd) == ("Iter(train) [ 3/10]  a{b}: 1.5000  count: 3.0000  "
                                  "lr_group1: 1.0000e-03  x: nan")


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


def test_training_lines_reach_every_handler_as_logger_info_would_write_them(tmp_path, capsys):
    """log_info_line formats once for the run's own handlers and writes them directly: the text
    must be exactly what logging writes, and a user's handler or filter still gets a record."""
    import logging

    from distributed_runner.core.log import log_info_line, setup_logger

    for rank in (0, 1):
        logger = setup_logger(tmp_path / f"r{rank}", rank, "INFO")
        logger.setLevel("INFO")  # rank 1 warns only by default; here both speak
        seen: list[logging.LogRecord] = []
        foreign = logging.Handler()
        foreign.emit = seen.append
        logger.addHandler(foreign)
        try:
            logger.info("reference line %d", 1)
            log_info_line(logger, "reference line 1")
            out = capsys.readouterr().out.splitlines()
            assert len(out) == 2 and out[0] == out[1] and out[0].endswith(
                ("[rank 1] " if rank else "INFO ") + "reference line 1")
            if rank == 0:  # the training line reaches the file within FLUSH_SECONDS, unasked
                run_log, deadline = tmp_path / "r0" / "logs" / "run.log", time.monotonic() + 5
                while len(run_log.read_text().splitlines()) < 2 and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert run_log.read_text().splitlines() == out
            assert [r.getMessage() for r in seen] == ["reference line 1"] * 2
            logger.addFilter(lambda record: "secret" not in record.getMessage())
            log_info_line(logger, "a secret line")
            assert capsys.readouterr().out == "" and len(seen) == 2
            logger.setLevel("WARNING")
            log_info_line(logger, "not at WARNING")
            assert capsys.readouterr().out == ""
        finally:
            logger.removeHandler(foreign)
            logger.filters.clear()


def test_training_lines_to_a_file_share_a_flush_a_second_and_a_warning_flushes_at_once(
        tmp_path):
    """A flush is a write to the OS: training lines to a file or a piped stdout are flushed by
    LineFlusher at most once a second, and any other message (flushed at once) takes them too."""
    from distributed_runner.core.log import LINE_FLUSHER, log_info_line, setup_logger

    logger = setup_logger(tmp_path, 0, "INFO")
    file_handler = next(h for h in logger.handlers if hasattr(h, "baseFilename"))
    flushes = []
    real_flush = file_handler.flush
    file_handler.flush = lambda: (flushes.append(time.monotonic()), real_flush())
    run_log = tmp_path / "logs" / "run.log"
    try:
        start = time.monotonic()
        for i in range(50):
            log_info_line(logger, f"Epoch(train) [1][{i + 1}/50]")
        deadline = start + 5
        while len(run_log.read_text().splitlines()) < 50 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(run_log.read_text().splitlines()) == 50
        assert 1 <= len(flushes) <= 2 and flushes[0] - start >= 0.5  # not one per line
        log_info_line(logger, "Epoch(train) [2][1/50]")
        logger.warning("a warning")  # flushes the stream, the pending training line with it
        assert run_log.read_text().splitlines()[-2:][0].endswith("Epoch(train) [2][1/50]")
        log_info_line(logger, "Epoch(train) [2][2/50]")
        LINE_FLUSHER.flush_now()  # what the end of a run and a checkpoint call
        assert run_log.read_text().splitlines()[-1].endswith("Epoch(train) [2][2/50]")
    finally:
        file_handler.flush = real_flush


def _warn_from_child() -> None:
    import logging

    logging.getLogger("distributed_runner").warning("from a forked child")


def test_a_forked_child_that_logs_does_not_write_the_parents_pending_lines_again(tmp_path):
    import multiprocessing

    from distributed_runner.core.log import log_info_line, setup_logger

    logger = setup_logger(tmp_path, 0, "INFO")
    log_info_line(logger, "Epoch(train) [1][10/50]")  # pending: LineFlusher's next second
    child = multiprocessing.get_context("fork").Process(target=_warn_from_child)
    child.start()
    child.join(30)
    assert child.exitcode == 0
    logger.warning("back in the parent")
    lines = (tmp_path / "logs" / "run.log").read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        "INFO Epoch(train) [1][10/50]", "WARNING from a forked child",
        "WARNING back in the parent"]


def test_history_converts_cpu_tensors_and_tensors_that_need_grad_exactly():
    buf = HistoryBuffer()
    leaf = torch.tensor(2.5, requires_grad=True)
    values = [torch.tensor(0.1, dtype=torch.float64), leaf * 2, torch.tensor(7), 1.5,
              torch.tensor([1.0, 3.0])]
    for v in values:
        buf.update(v)
    assert buf.values() == [0.1, 5.0, 7.0, 1.5, 2.0]


def test_logger_hook_out_dir_copies_the_run_files_as_mmengine(tmp_path):
    """MMEngine's LoggerHook(out_dir=...): after the run the logs and the config go to
    out_dir/<basename(work_dir)>, by suffix; keep_local=True (the default) keeps them here."""
    from tests.toy import make_runner

    logger = dict(type="LoggerHook", interval=5, out_dir=str(tmp_path / "shared"),
                  out_suffix=(".jsonl", ".py"))
    make_runner(tmp_path / "exp", default_hooks=dict(logger=logger)).train()
    copied = sorted(p.relative_to(tmp_path / "shared" / "exp").as_posix()
                    for p in (tmp_path / "shared" / "exp").rglob("*") if p.is_file())
    assert copied == ["config.py", "logs/scalars.jsonl"]  # no run.log: not in out_suffix
    assert (tmp_path / "shared" / "exp" / "logs" / "scalars.jsonl").read_bytes() == \
        (tmp_path / "exp" / "logs" / "scalars.jsonl").read_bytes()


def test_json_lines_are_what_json_dumps_writes_for_every_kind_of_value():
    """JsonlSink fills a prepared line per key set; the text must be json.dumps's exactly."""
    from distributed_runner.tracking.sinks.jsonl import json_line

    records = [
        LogRecord("train", 640, 10, {"lr": 0.01, "data_time": 1.7e-4, "loss": 0.4123}),
        LogRecord("val", 3, 1, {'a%d"b': 1.5, "ünï": 1e-300, "big": 1.7976931348623157e308}),
        LogRecord("train", 3, 1, {"x": float("nan"), "n": 2}),
        LogRecord("train", 3, 1, {"y": float("-inf")}), LogRecord("test", 3, 1, {}),
        LogRecord("train", 3, 1, {"flag": True}), LogRecord("train", 3, 1, {"lr": 0.02})]
    for record in records + records:  # the second pass takes the prepared lines
        line = json_line(record)
        assert line == json.dumps({"mode": record.mode, "step": record.step,
                                   "epoch": record.epoch, **record.scalars}) + "\n"
        assert json.loads(line)["step"] == record.step
