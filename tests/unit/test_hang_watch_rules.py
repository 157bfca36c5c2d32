"""The hang watch's rules on the Ray controller (issue 40), on views of ranks, without Ray:
progress is bounded by the phase's allowance, silence by hang_timeout in every phase, and a
report that fails still kills the rank and restarts the group; the report quotes the limit that
was passed, by whichever rank passed it."""
from types import SimpleNamespace

import pytest

from distributed_runner.health import hang_watch
from distributed_runner.health.hang_watch import HangWatch, RankHangError, RankView
from distributed_runner.health.watchdog import parse_watchdog

SETTINGS = parse_watchdog(dict(hang_timeout=4))  # checkpoint 1800 s, val 3600 s by default


def view(rank, phase, since, unanswered_since=None):
    worker = SimpleNamespace(actor=f"actor{rank}",
                             metadata=SimpleNamespace(pid=100 + rank, node_ip="127.0.0.1",
                                                      node_id="abcdef0123456789"))
    return RankView(rank, worker, phase=phase, iter=7, since=since,
                    unanswered_since=unanswered_since)


@pytest.mark.parametrize("phase", ["checkpoint", "val", "teardown", "first_iter"])
def test_a_rank_silent_in_a_slow_phase_is_hung_after_hang_timeout(phase):
    watch = HangWatch(SETTINGS, "/tmp")
    answering = view(0, phase, since=0.0)  # slow work that still answers: its phase allows it
    assert watch._verdict(answering, now=100.0) is None
    stopped = view(1, phase, since=0.0, unanswered_since=95.5)
    assert watch._verdict(stopped, now=99.0) is None  # 3.5 s of silence
    verdict = watch._verdict(stopped, now=100.0)  # 4.5 s
    assert verdict.mute and verdict.limit == 4 and verdict.key == "watchdog.hang_timeout"


def test_progress_is_still_bounded_by_the_phase_allowance():
    watch = HangWatch(SETTINGS, "/tmp")
    assert watch._verdict(view(0, "step", since=0.0), now=4.5).key == "watchdog.hang_timeout"
    assert watch._verdict(view(0, "checkpoint", since=0.0), now=1000.0) is None
    late = watch._verdict(view(0, "checkpoint", since=0.0), now=1801.0)
    assert not late.mute and late.key == "watchdog.phase_timeouts.checkpoint"


def test_a_report_that_fails_still_kills_the_rank_and_restarts(monkeypatch, capsys):
    watch = HangWatch(SETTINGS, "/tmp")
    watch.views = [view(0, "checkpoint", since=0.0), view(1, "val", 0.0, unanswered_since=1.0)]
    killed = []
    monkeypatch.setattr(hang_watch.ray, "kill", killed.append)

    def broken(now):
        raise RuntimeError("py-spy and the stack task both failed")

    monkeypatch.setattr(watch, "_report", broken)
    with pytest.raises(RankHangError) as raised:
        watch._fail(now=10.0)
    line = capsys.readouterr().err.strip()
    assert "\n" not in line and line in str(raised.value)
    assert line.startswith("drun hang watch: rank 1 hung (phase 'val', iteration 7) and the "
                           "report of it failed (RuntimeError: py-spy and the stack task both")
    assert killed == ["actor1"]


def test_a_peer_that_passed_its_limit_first_is_named_with_the_figure_that_tripped():
    """Rank 0 waits in a collective for rank 1, which stopped making progress later: rank 0's
    verdict fires the watch, rank 1 is the culprit, and the report does not quote rank 1's
    3.5 s against a 4 s limit it has not reached."""
    watch = HangWatch(SETTINGS, "/tmp")
    waiting, hung = view(0, "step", since=0.0), view(1, "step", since=1.0)
    watch.views = [waiting, hung]
    line = watch._first_line(hung, now=4.5)
    assert line.startswith("drun hang watch: rank 1 hung: no progress for 3.5 s; rank 0 passed "
                           "its limit first: no progress for 4.5 s (limit 4 s, "
                           "watchdog.hang_timeout) in phase 'step' at iteration 7; it answers")
    own = watch._first_line(hung, now=5.5)  # past its own limit: its own figure
    assert own.startswith("drun hang watch: rank 1 hung: no progress for 4.5 s (limit 4 s, ")
