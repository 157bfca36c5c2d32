"""The suite's time budget (tests/suite_budget.py, issue 47), run as pytest runs it: an inner
pytest session per case (pytester), with the project's conftest and a budget of a fraction of a
second so that a short sleep is "over budget"."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[2]

CONFTEST = "from tests.suite_budget import pytest_addoption, pytest_configure, " \
           "pytest_runtest_protocol  # noqa: F401\n"


@pytest.fixture
def inner(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the inner session imports tests.suite_budget
    pytester.makeconftest(CONFTEST)

    def run(body: str, *args: str):
        pytester.makepyfile(test_cases=textwrap.dedent(body))
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--durations=5", *args)
    return run


CASES = '''
    import time
    import pytest

    def test_quick():
        pass

    def test_unmarked_and_over():
        time.sleep(0.6)

    @pytest.mark.slow("sleeps on purpose")
    def test_marked_and_over():
        time.sleep(0.6)
'''


def test_an_unmarked_test_over_the_budget_fails_the_session_and_is_named(inner):
    result = inner(CASES, "--slow-budget=0.3")
    assert result.ret == 1
    out = result.stdout.str()
    assert "3 passed" in out  # every test passed: the budget alone failed the run
    over = [line for line in out.splitlines() if line.startswith("over the 0.3 s budget")]
    assert len(over) == 1 and "test_unmarked_and_over took 0.6 s" in over[0]
    assert "mark it @pytest.mark.slow" in over[0]


def test_the_table_shows_the_slow_reason_and_the_wall_time(inner):
    result = inner(CASES, "--slow-budget=5")
    assert result.ret == 0
    out = result.stdout.str()
    assert "slowest 3 tests (setup + call + teardown)" in out
    (marked,) = [line for line in out.splitlines() if "test_marked_and_over" in line]
    assert marked.endswith("[slow: sleeps on purpose]")
    assert re.search(r"suite: 3 tests ran in \d+ s wall", out)
    assert re.search(r"costliest 1 files .*\n +[\d.]+s test_cases.py \(3 tests\)", out)
    # pytest's own per-phase table is replaced, not printed beside this one
    assert "slowest durations" not in out


def test_a_slow_or_serial_mark_without_a_reason_is_refused(inner):
    result = inner('''
        import pytest

        @pytest.mark.slow
        def test_no_reason():
            pass
    ''')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "@pytest.mark.slow needs a reason" in result.stderr.str()


def span_module(log: Path) -> str:
    """The head of an inner test file whose tests call ``span(name, seconds)``: a sleep whose
    start and end are appended to ``log``."""
    return f'''
        import time
        import pytest

        def span(name, seconds):
            start = time.time()
            time.sleep(seconds)
            with open({str(log)!r}, "a") as f:
                f.write(f"{{name}} {{start}} {{time.time()}}\\n")
    '''


def read_spans(log: Path) -> dict[str, tuple[float, float]]:
    return {name: (float(a), float(b)) for name, a, b in
            (line.split() for line in log.read_text().splitlines())}


@pytest.mark.slow("an inner pytest session with 2 xdist workers")
def test_under_xdist_a_serial_test_runs_while_no_other_does(inner, tmp_path):
    """Two files (loadfile: one a worker): the serial test's span overlaps no other test's."""
    log = tmp_path / "spans.txt"
    result = inner(span_module(log) + '''
        @pytest.mark.serial("measures time")
        def test_serial():
            time.sleep(0.3)  # the other worker has started its first test
            span("serial", 1.0)
    ''' + "".join(f'''
        def test_other_{i}():
            span("other_{i}", 0.4)
    ''' for i in range(6)), "-n", "2", "--dist", "load")
    assert result.ret == 0, result.stdout.str()[-2000:]
    spans = read_spans(log)
    start, end = spans.pop("serial")
    assert len(spans) == 6
    assert all(b <= start or a >= end for a, b in spans.values()), (start, end, spans)


@pytest.mark.slow("an inner pytest session with 2 xdist workers")
def test_serial_tests_in_a_row_keep_the_machine_and_the_waits_are_printed(inner, tmp_path):
    """Two serial tests one after the other in a file: no other test starts between them (the
    lock is kept, not handed to the other worker for a test in the gap); the summary says how
    long each worker waited for serial tests."""
    log = tmp_path / "spans.txt"
    body = span_module(log) + '''
        @pytest.mark.serial("measures time")
        def test_serial_1():
            time.sleep(0.3)  # the other worker has started its first test
            span("serial_1", 0.5)

        @pytest.mark.serial("measures time")
        def test_serial_2():
            span("serial_2", 0.5)
    ''' + "".join(f'''
        def test_other_{i}():
            span("other_{i}", 0.3)
    ''' for i in range(8))
    result = inner(body, "-n", "2", "--dist", "load")
    assert result.ret == 0, result.stdout.str()[-2000:]
    spans = read_spans(log)
    first_start, _ = spans.pop("serial_1")
    _, last_end = spans.pop("serial_2")
    assert all(b <= first_start or a >= last_end for a, b in spans.values()), spans
    assert re.search(r"; waited for serial tests: gw0 \d+ s, gw1 \d+ s$",
                     result.stdout.str(), re.MULTILINE)
