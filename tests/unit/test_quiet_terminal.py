"""Issue 28: the long reports (hook plan, hook time table) go whole to ``work_dir/logs/run.log``
and short to the terminal, which names the file."""
import logging

from distributed_runner.core.log import LINE_FLUSHER, log_brief_and_full, run_log_file
from distributed_runner.engine.hook_report import HookTiming, timing_summary
from tests.toy import make_runner


def test_the_terminal_gets_a_short_hook_plan_and_the_log_file_the_whole_one(tmp_path, capsys):
    runner = make_runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=1), log_level="INFO")
    out = capsys.readouterr().out
    run_log = (tmp_path / "logs" / "run.log").resolve()
    LINE_FLUSHER.flush_now()  # the file gets report lines within a second (log.py)
    full = run_log.read_text()
    start = out.index("Hooks in call order:")
    plan = out[start:out.index("\n", out.index(str(run_log), start))]
    # every hook in call order with its priority, the marks, the sinks, where the rest is
    names = [e.name for e in runner._hooks.entries]
    assert [plan.index(f"{n} ") for n in names] == sorted(plan.index(f"{n} ") for n in names)
    flat = " ".join(plan.split())  # wrapped to the terminal's width
    assert "runtime_info VERY_HIGH (10)" in flat
    assert "logger BELOW_NORMAL (60) [on_error=warn]" in flat
    assert "log sinks: jsonl." in flat  # the toy config names only jsonl
    assert len(plan.splitlines()) < len(runner.hook_plan().splitlines()) / 2
    assert "Mount points:" not in out
    # the log file has the whole plan (drun hooks prints the same) and not the short one
    assert runner.hook_plan() in full and "Mount points:" in full and "Extension points:" in full
    assert "Hooks in call order:" not in full


def test_a_logger_without_a_log_file_gets_the_whole_text():
    logger = logging.getLogger("test_quiet_terminal")
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    logger.setLevel("INFO")
    try:
        assert run_log_file(logger) is None
        log_brief_and_full(logger, "short", "the whole report")
        assert seen == ["the whole report"]
    finally:
        logger.removeHandler(handler)


def test_the_timing_summary_names_the_slowest_and_the_file():
    rows = [HookTiming("checkpoint", "after_val_epoch", 0.055, 12, 0),
            HookTiming("timer", "after_train_iter", 0.010, 540, 2),
            HookTiming("logger", "after_train_iter", 0.006, 540, 0),
            HookTiming("runtime_info", "before_train", 0.0001, 1, 0)]
    text = timing_summary(rows, "/w/logs/run.log")
    assert text == ("Hook time: 0.071 s in 4 (hook, mount point) pairs; slowest: "
                    "checkpoint.after_val_epoch 0.055 s, timer.after_train_iter 0.010 s, "
                    "logger.after_train_iter 0.006 s; 2 errors. Full table: /w/logs/run.log")
    assert timing_summary([], None) == "Hook time: 0.000 s in 0 (hook, mount point) pairs"
