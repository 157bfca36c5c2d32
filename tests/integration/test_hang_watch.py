"""Hangs through Ray (CPU, gloo, 2 workers): a training thread hung inside a hook and a worker
process stopped with SIGSTOP are each named (rank, phase, iteration, stack) within
``watchdog.hang_timeout``, the group restarts, and the run ends with the weights of an
uninterrupted one."""
import os
import re
import signal
import threading
import time

import pytest

from tests.integration.test_ray_train import DATA, dumps, equal_states, fit
from tests.toy import base_cfg

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HANG = 4.0  # watchdog.hang_timeout of these runs
SLACK = 3.0  # a poll, a heartbeat read and a loaded 2-core machine
SETUP_LIMIT = 6.0  # watchdog.phase_timeouts.first_iter: the Runner's build and first step


def hang_cfg(work_dir, *hooks):
    """15 iterations on 2 workers (5 an epoch, validation after each), a checkpoint every 4."""
    cfg = base_cfg(work_dir, **DATA)
    cfg.update(custom_imports=dict(imports=["tests.hang_probe"]),
               launcher=dict(type="ray", num_workers=2, max_failures=3),
               default_hooks=dict(logger=dict(type="LoggerHook", interval=5, sinks=["jsonl"]),
                                  checkpoint=dict(type="CheckpointHook", interval=4,
                                                  by_epoch=False)),
               custom_hooks=[dict(type="SyncBuffersHook"), *hooks, dict(type="StartTimesHook"),
                             dict(type="RankDumpHook")],
               watchdog=dict(hang_timeout=HANG, collective_timeout=30,
                             phase_timeouts=dict(first_iter=SETUP_LIMIT)))
    return cfg


@pytest.fixture(scope="module")
def reference(ray_cluster, tmp_path_factory):
    wd = tmp_path_factory.mktemp("hang_reference")
    status, _, _ = fit(hang_cfg(wd))
    assert status == 0
    return wd


def stop_when_asked(work_dir, out):
    """The test's side of StopMeOnceHook: SIGSTOP the pid the worker publishes."""
    marker = work_dir / "stop_me"
    while not marker.exists():
        time.sleep(0.02)
    time.sleep(0.05)  # the whole line is written
    pid = int(marker.read_text().split()[0])
    os.kill(pid, signal.SIGSTOP)
    out["stopped_at"] = time.time()


def detected_after(report):
    """The seconds without progress the report's first line gives."""
    return float(re.search(r"no progress for ([\d.]+) s", report).group(1))


def test_a_hung_thread_and_a_stopped_worker_are_named_and_the_run_resumes_exactly(reference,
                                                                                  tmp_path):
    out = {}
    threading.Thread(target=stop_when_asked, args=(tmp_path, out), daemon=True).start()
    built = tmp_path / "built_once"
    cfg = hang_cfg(tmp_path, dict(type="HangWhileBuiltHook", marker=str(built), rank=1),
                   dict(type="HangOnceHook", at_iter=6, rank=1),
                   dict(type="StopMeOnceHook", at_iter=11, rank=1))
    status, _, _ = fit(cfg)
    assert status == 0
    reports = sorted((tmp_path / "hangs").glob("*.txt"), key=lambda p: p.stat().st_mtime)
    assert len(reports) == 3, reports
    setup_path, hung_path, stopped_path = reports
    setup, hung, stopped = (p.read_text() for p in reports)

    # the first attempt: rank 1 hung while its Runner was being built (before train())
    assert setup.startswith("drun hang watch: rank 1 hung: no progress for ")
    assert "watchdog.phase_timeouts.first_iter) in phase 'setup' at iteration 0" in setup
    rank1 = setup.split("== rank 1 ==")[1].split("== rank 0 ==")[0]
    assert "hang_here_forever" in rank1 and "HangWhileBuiltHook.__init__" in rank1
    took_setup = setup_path.stat().st_mtime - float(built.read_text())
    assert SETUP_LIMIT <= detected_after(setup) <= SETUP_LIMIT + SLACK, setup[:400]
    assert took_setup <= SETUP_LIMIT + SLACK, took_setup

    # the training thread of rank 1 hung inside a hook at iteration 6
    assert hung.startswith("drun hang watch: rank 1 hung: no progress for ")
    assert "(limit 4 s, watchdog.hang_timeout) in phase 'step' at iteration 6; it answers" in hung
    assert "rank 0: phase 'step', iteration 6" in hung  # waiting for rank 1
    rank1 = hung.split("== rank 1 ==")[1].split("== rank 0 ==")[0]
    assert re.match(r" \(pid \d+ on node [\d.]+ \w{8}; stacks dumped by the worker itself\)",
                    rank1), rank1[:200]
    assert "hang_here_forever" in rank1 and "HangOnceHook.before_train_iter" in rank1
    began = float((tmp_path / "hung_once").read_text())
    took = hung_path.stat().st_mtime - began
    assert HANG <= detected_after(hung) <= HANG + SLACK and took <= HANG + SLACK, (hung, took)

    # rank 1's process was stopped at iteration 11: py-spy read its stack from outside
    assert stopped.startswith("drun hang watch: rank 1 hung: no progress for ")
    assert "in phase 'step' at iteration 11; it has not answered a heartbeat read" in stopped
    rank1 = stopped.split("== rank 1 ==")[1].split("== rank 0 ==")[0]
    assert re.match(r" \(pid \d+ on node [\d.]+ \w{8}; stacks read by py-spy on ", rank1)
    assert "wait_to_be_stopped" in rank1
    took_stopped = stopped_path.stat().st_mtime - out["stopped_at"]
    assert HANG <= detected_after(stopped) <= HANG + SLACK and took_stopped <= HANG + SLACK

    # four attempts: two from the start (the first never reached train()), from iter_4, iter_8
    starts = [line.split() for line in (tmp_path / "starts.txt").read_text().splitlines()]
    assert [int(it) for _, it in starts] == [0, 4, 8]
    after, ref = dumps(tmp_path), dumps(reference)
    assert equal_states(after[0]["state"], ref[0]["state"])
    assert equal_states(after[1]["state"], ref[1]["state"])
    print(f"hung while built: report {took_setup:.2f} s after it hung, next attempt "
          f"{float(starts[0][0]) - setup_path.stat().st_mtime:.2f} s later; "
          f"hung thread: no progress for {detected_after(hung)} s when detected, report written "
          f"{took:.2f} s after it hung, next attempt "
          f"{float(starts[1][0]) - hung_path.stat().st_mtime:.2f} s later; stopped process: "
          f"no progress for {detected_after(stopped)} s, report written {took_stopped:.2f} s "
          f"after SIGSTOP, next attempt "
          f"{float(starts[2][0]) - stopped_path.stat().st_mtime:.2f} s later")
