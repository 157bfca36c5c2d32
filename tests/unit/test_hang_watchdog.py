"""The hang watch without Ray: the heartbeat's phases and allowances, a ``drun train`` whose hook
hangs exits with the watchdog's code and every thread's stack, and slow-by-nature phases longer
than ``hang_timeout`` (the first iteration, a checkpoint save, a validation) are no alarm."""
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distributed_runner import Config
from distributed_runner.core.errors import ConfigError
from distributed_runner.health.heartbeat import (
    CHECKPOINT,
    DATA,
    DATA_WARMUP,
    FIRST_ITER,
    SETUP,
    STEP,
    VAL,
    Heartbeat,
    limit_of,
)
from distributed_runner.health.watchdog import HANG_EXIT_CODE, parse_watchdog
from tests.toy import base_cfg

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = parse_watchdog(dict(hang_timeout=2, collective_timeout=3,
                               phase_timeouts=dict(first_iter=10, val=20, checkpoint=30,
                                                   data_warmup=40)))


def test_each_phase_has_its_allowance_and_a_slow_one_carries_into_the_next_iteration():
    beat = Heartbeat()
    beat.settings = SETTINGS
    seen = []

    def limit():
        seen.append((beat.phase, limit_of(beat.phase, beat.carry, SETTINGS)))

    beat.reset(SETUP)
    beat.mark(SETUP), limit()
    beat.mark(DATA_WARMUP), limit()  # the setup's (first_iter) allowance is smaller: 40 wins
    beat.stepping(), limit()
    beat.stepped(1), limit()
    beat.stepping(), limit()
    with beat.slow(CHECKPOINT):  # rank 0 writes; the others wait for it in the next step
        limit()
    limit()
    beat.stepped(2), beat.stepping(), limit()
    with beat.slow(VAL):
        with beat.slow(CHECKPOINT):  # save_best inside the validation
            limit()
        limit()
    beat.stepped(3), limit()
    assert seen == [(SETUP, 10), (DATA_WARMUP, 40), (FIRST_ITER, 40), (DATA, 2), (STEP, 2),
                    (CHECKPOINT, 30), (STEP, 30), (STEP, 2), (CHECKPOINT, 30), (VAL, 30),
                    (DATA, 2)]


def test_collective_timeout_must_exceed_hang_timeout_in_one_line():
    with pytest.raises(ConfigError, match=r"^watchdog.collective_timeout: must exceed "
                                          r"watchdog.hang_timeout \(300 s\), got 60 s"):
        parse_watchdog(dict(collective_timeout=60))


def drun_train(tmp_path, **overrides):
    cfg = base_cfg(tmp_path / "work", custom_imports=dict(imports=["tests.hang_probe"]),
                   **overrides)
    path = tmp_path / "cfg.py"
    path.write_text(Config(cfg).pretty_text())
    start = time.time()
    out = subprocess.run([sys.executable, "-m", "distributed_runner.cli", "train", str(path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    return out, start


@pytest.mark.serial("a hang caught within a few seconds")
def test_a_hook_that_hangs_ends_the_process_with_the_stacks(tmp_path):
    out, _ = drun_train(tmp_path, custom_hooks=[dict(type="HangOnceHook", at_iter=3, rank=0)],
                        watchdog=dict(hang_timeout=2, collective_timeout=4))
    assert out.returncode == HANG_EXIT_CODE, out.stderr[-3000:]
    work = tmp_path / "work"
    began = float((work / "hung_once").read_text())
    report = next((work / "hangs").glob("rank0-*.txt"))
    taken = report.stat().st_mtime - began
    block = re.search(r"drun watchdog: rank 0 hung: no progress for ([\d.]+) s \(limit 2 s, "
                      r"watchdog.hang_timeout\) in phase 'step' at iteration 3", out.stderr)
    assert block, out.stderr[-3000:]
    assert 2 <= float(block.group(1)) <= 3.5 and 2 <= taken <= 4, (block.group(0), taken)
    assert "hang_here_forever" in out.stderr and "hang_here_forever" in report.read_text()
    assert "hang_here_forever" in (work / "logs" / "run.log").read_text()
    print(f"non-Ray hang: detected {taken:.2f} s after the hook hung ({block.group(0)})")


SLOW = dict(train_cfg=dict(by_epoch=True, max_epochs=1, val_interval=1))


@pytest.mark.serial("a hang caught within a few seconds")
def test_a_thread_that_never_lets_the_gil_go_still_ends_the_process_with_the_stacks(tmp_path):
    """The watchdog thread cannot run while the training thread holds the GIL; faulthandler's
    timer (no GIL needed), which the watchdog re-arms while it can, ends the process."""
    out, _ = drun_train(
        tmp_path,
        custom_hooks=[dict(type="HoldTheGilHook", at_iter=3)],
        watchdog=dict(hang_timeout=2, collective_timeout=4),
    )
    began = float((tmp_path / "work" / "holding_the_gil").read_text())
    taken = time.time() - began
    assert out.returncode == 1, out.stderr[-3000:]
    assert "Timeout (0:00:03)!" in out.stderr, out.stderr[-3000:]
    assert "hold_the_gil_here" in out.stderr  # the training thread's stack, where it holds it
    assert 2 <= taken <= 6, taken  # 1.5 x hang_timeout after the last re-arm, not 600 s
    print(f"GIL held: the process ended {taken:.2f} s after the hook took the GIL")


@pytest.mark.serial("phases timed against allowances of seconds")
@pytest.mark.slow("phases run for seconds, right under their allowances")
def test_slow_phases_within_their_allowance_are_no_alarm(tmp_path):
    out, start = drun_train(
        tmp_path, **SLOW,
        custom_hooks=[dict(type="SlowPhasesHook", first_iter=2.5, save=2.5, val=2.5)],
        watchdog=dict(hang_timeout=1, collective_timeout=2,
                      phase_timeouts=dict(first_iter=5, val=5, checkpoint=5)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (tmp_path / "work" / "hangs").exists()
    assert (tmp_path / "work" / "epoch_1.pth").is_file()
    assert time.time() - start > 7.5  # the three slow phases did run


@pytest.mark.serial("phases timed against allowances of seconds")
@pytest.mark.slow("a torch.compile'd first iteration")
def test_a_compiled_first_iteration_is_no_alarm(tmp_path):
    """A real ``torch.compile`` (inductor on CPU): the first step compiles for seconds (1.3-1.5
    s with inductor's caches warm, 4.5 s cold), over ``hang_timeout=0.5``; the default
    ``first_iter`` allowance covers it, and later steps are watched with the 0.5 s limit."""
    out, _ = drun_train(tmp_path, **SLOW, compile=True,
                        custom_hooks=[dict(type="FirstStepTimeHook")],
                        watchdog=dict(hang_timeout=0.5, collective_timeout=2))
    assert out.returncode == 0, out.stderr[-3000:]
    work = tmp_path / "work"
    assert not (work / "hangs").exists()
    first_step = float((work / "first_step_s").read_text())
    assert first_step > 0.5, f"the compiled first step took {first_step:.2f} s: over no limit"
    print(f"compiled first step: {first_step:.1f} s, hang_timeout 0.5 s, no alarm")


@pytest.mark.serial("phases timed against allowances of seconds")
def test_a_validation_longer_than_its_allowance_is_a_hang(tmp_path):
    """The same slow validation with ``val`` (and the save before it) allowed less."""
    out, _ = drun_train(
        tmp_path, **SLOW, custom_hooks=[dict(type="SlowPhasesHook", val=2.5)],
        watchdog=dict(hang_timeout=1, collective_timeout=2,
                      phase_timeouts=dict(val=1.5, checkpoint=1.5)))
    assert out.returncode == HANG_EXIT_CODE, out.stderr[-3000:]
    assert ("(limit 1.5 s, watchdog.phase_timeouts.val) in phase 'val' at iteration 10"
            in out.stderr)
    assert re.search(r'hang_probe.py", line \d+ in before_val', out.stderr), out.stderr[-3000:]


def test_a_misspelled_watchdog_key_is_one_line_naming_the_nearest():
    with pytest.raises(ConfigError) as info:
        parse_watchdog(dict(hang_timout=5))
    assert str(info.value).startswith(
        "watchdog.hang_timout: unknown key (did you mean 'hang_timeout'"
    )
    assert "watchdog takes enabled, hang_timeout, phase_timeouts, collective_timeout" in str(
        info.value
    )
