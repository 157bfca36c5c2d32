"""The suite's time budget (issue 47), a pytest plugin loaded by ``tests/conftest.py``.

- ``@pytest.mark.slow("why")``: a test that may take more than ``--slow-budget`` seconds
  (setup, call and teardown together). The reason is required, and it is what the slowest-tests
  table prints beside the test: a slow test says what it pays for.
- ``--slow-budget=S`` (pyproject's addopts: 60): the session fails when a test without the
  marker took more than S seconds, naming each one. A deselected or skipped test costs nothing.
- ``--durations=N`` prints this plugin's table instead of pytest's: the N slowest *tests*
  (their phases summed, so a module fixture's setup counts where it is paid), each with its
  ``slow`` reason, then the costliest files (their tests summed), then the suite's wall time
  and test count; every test's seconds are kept in pytest's cache (``drun/durations``). Under
  pytest-xdist the controller sees every worker's reports, so the tables and the budget cover
  the whole run.
- ``@pytest.mark.serial("why")``: a timing-sensitive test (it measures a ratio of step times, a
  hang caught within seconds). Under xdist it runs alone: it takes a machine-wide lock that
  every other test takes shared, so the other worker waits between its tests while this one runs.
  Serial tests that follow one another in a worker keep the lock between them (the other worker
  would otherwise start a test in each gap, and the next serial test wait for its end). The
  seconds each worker waited for them are printed with the wall time. Without xdist (one
  process) the lock is not taken: everything is serial already.
"""
from __future__ import annotations

import fcntl
import time
from collections import defaultdict
from pathlib import Path

import pytest



def is_xdist_worker(config: pytest.Config) -> bool:
    """In a pytest-xdist worker (its controller prints the summary and holds the budget). The
    config says so, not the environment: a pytest run inside a worker's test inherits it."""
    return hasattr(config, "workerinput")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow-budget", type=float, default=None, metavar="S",
                     help="fail the session if a test not marked slow('why') takes over S "
                          "seconds (setup + call + teardown)")


def reason_of(mark: pytest.Mark | None) -> str | None:
    if mark is None:
        return None
    reason = mark.kwargs.get("reason") or (mark.args[0] if mark.args else None)
    return reason if isinstance(reason, str) and reason.strip() else None


class SuiteBudget:
    """Sums each test's phase durations and knows each test's ``slow`` reason."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rows = int(config.option.durations or 0)
        config.option.durations = None  # this table replaces pytest's per-phase one
        self.budget = config.option.slow_budget
        self.seconds: dict[str, float] = defaultdict(float)
        self.reasons: dict[str, str] = {}
        self.ran: set[str] = set()
        self.waited: dict[str, float] = defaultdict(float)  # per xdist worker, for serial tests
        self.started = time.monotonic()
        self.worker = is_xdist_worker(config)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            for name in ("slow", "serial"):
                mark = item.get_closest_marker(name)
                if mark is not None and reason_of(mark) is None:
                    raise pytest.UsageError(
                        f"{item.nodeid}: @pytest.mark.{name} needs a reason: "
                        f"@pytest.mark.{name}(\"what it waits for\")")
            slow = reason_of(item.get_closest_marker("slow"))
            if slow is not None:  # travels with the reports to xdist's controller
                item.user_properties.append(("slow_reason", slow))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            if report.outcome != "skipped":
                self.ran.add(report.nodeid)
        properties = dict(report.user_properties)
        reason = properties.get("slow_reason")
        if reason:
            self.reasons[report.nodeid] = reason
        node = getattr(report, "node", None)  # xdist's controller: the worker that ran it
        if report.when == "setup" and node is not None:
            self.waited[node.workerinput["workerid"]] += properties.get("serial_wait", 0.0)

    def over_budget(self) -> list[tuple[str, float]]:
        if self.budget is None:
            return []
        return sorted(((nodeid, s) for nodeid, s in self.seconds.items()
                       if nodeid in self.ran and s > self.budget and nodeid not in self.reasons),
                      key=lambda pair: -pair[1])

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int) -> None:
        if self.worker:
            return
        write = terminalreporter.write_line
        timed = sorted(((s, n) for n, s in self.seconds.items() if n in self.ran), reverse=True)
        if self.rows and timed:
            terminalreporter.write_sep("=", f"slowest {min(self.rows, len(timed))} tests "
                                            "(setup + call + teardown)")
            for seconds, nodeid in timed[:self.rows]:
                why = self.reasons.get(nodeid)
                write(f"{seconds:8.1f}s {nodeid}" + (f"  [slow: {why}]" if why else ""))
            self.write_files(terminalreporter, timed)
        wall = time.monotonic() - self.started
        cache = getattr(self.config, "cache", None)  # absent under -p no:cacheprovider
        if cache is not None and timed:  # every test's seconds, for planning merges
            cache.set("drun/durations", {n: round(s, 2) for s, n in timed})
        if self.ran:
            waits = ", ".join(f"{w} {s:.0f} s" for w, s in sorted(self.waited.items()))
            write(f"suite: {len(self.ran)} tests ran in {wall:.0f} s wall "
                  f"({sum(self.seconds.values()):.0f} s of test time)"
                  + (f"; waited for serial tests: {waits}" if waits else ""))
        for nodeid, seconds in self.over_budget():
            terminalreporter.write_line(
                f"over the {self.budget:g} s budget: {nodeid} took {seconds:.1f} s; make it "
                "cheaper or mark it @pytest.mark.slow(\"why it needs the time\")", red=True)

    def write_files(self, terminalreporter, timed: list[tuple[float, str]]) -> None:
        """The files that cost the most, summed over their tests: where a merge or a shared
        fixture pays off (a file's tests often start the same runs or servers)."""
        by_file: dict[str, list[float]] = defaultdict(list)
        for seconds, nodeid in timed:
            by_file[nodeid.split("::")[0]].append(seconds)
        heavy = sorted(by_file.items(), key=lambda pair: -sum(pair[1]))[:self.rows // 2]
        terminalreporter.write_sep("=", f"costliest {len(heavy)} files (their tests summed)")
        for path, seconds in heavy:
            terminalreporter.write_line(f"{sum(seconds):8.1f}s {path} ({len(seconds)} tests)")

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.worker and self.over_budget() and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow(reason): takes over the suite's per-test budget "
                                       "(--slow-budget); left out of the fast tier, "
                                       "-m 'not slow'. The reason is required.")
    config.addinivalue_line("markers", "serial(reason): timing-sensitive; under pytest-xdist "
                                       "it runs while no other test does. Reason required.")
    config.pluginmanager.register(SuiteBudget(config), "suite_budget")


class MachineLock:
    """This worker's side of the machine-wide lock: ``serial.lock``, which a serial test holds
    alone and every other test shared, and ``serial.gate``, taken first, so that a waiting serial
    test goes before the next shared taker (flock itself is not fair). A serial test followed by
    another in this worker keeps both (see :func:`pytest_runtest_protocol`)."""

    def __init__(self, folder: Path) -> None:
        # open for the worker's life: a flock lives with its open file, released at exit
        self.gate = open(folder / "serial.gate", "a")  # noqa: SIM115
        self.lock = open(folder / "serial.lock", "a")  # noqa: SIM115
        self.alone = False  # held exclusively, by a serial test or a chain of them

    def enter(self, serial: bool) -> float:
        """Take the lock for the next test; returns the seconds it waited."""
        if serial and self.alone:
            return 0.0
        started = time.monotonic()
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        fcntl.flock(self.lock, fcntl.LOCK_EX if serial else fcntl.LOCK_SH)
        if not serial:
            fcntl.flock(self.gate, fcntl.LOCK_UN)
        self.alone = serial
        return time.monotonic() - started

    def leave(self, next_is_serial: bool) -> None:
        if self.alone and next_is_serial:
            return
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        if self.alone:
            fcntl.flock(self.gate, fcntl.LOCK_UN)
        self.alone = False


MACHINE_LOCK = pytest.StashKey[MachineLock]()


def is_serial(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("serial") is not None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """Under xdist: a ``serial`` test holds the machine-wide lock alone; every other test holds
    it shared. Around the whole protocol, so that a module fixture's setup (a reference Ray run)
    and teardown count as its test's. The seconds a test waited for the lock travel with its
    reports (``serial_wait``) to the controller's summary."""
    if not is_xdist_worker(item.config):
        yield
        return
    if MACHINE_LOCK not in item.config.stash:
        folder = Path(item.config._tmp_path_factory.getbasetemp()).parent  # the session's workers'
        item.config.stash[MACHINE_LOCK] = MachineLock(folder)
    lock = item.config.stash[MACHINE_LOCK]
    item.user_properties.append(("serial_wait", round(lock.enter(is_serial(item)), 2)))
    try:
        yield
    finally:
        lock.leave(next_is_serial=is_serial(item) and is_serial(nextitem))
