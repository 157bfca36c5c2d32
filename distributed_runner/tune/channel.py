"""The in-process meeting point of a trial and the run it drives (``trial_launcher='none'``).

The Runner trains in a thread of the trial's process; its :class:`hooks.tune_report_hook.
TuneReportHook` hands each result over here and waits until the trial lets it go on, so the
checkpoint Tune keeps for a result is the run's state at that result. A stop is a flag the hook
turns into ``runner.request_stop`` — never a kill. Channels are found by name (the trial id), so
the run's config names its channel as plain data.
"""

from __future__ import annotations

import queue
import threading

from distributed_runner.tune.trial_run import TrialReport


class ReportChannel:
    """One run's reports, in order, and the trial's answers to them."""

    def __init__(self) -> None:
        self._reports: queue.Queue[TrialReport | None] = queue.Queue()
        self._go = threading.Event()
        self.stop_reason: str | None = None

    # -- the run's side (the report hook) -----------------------------------------------------
    def report(self, report: TrialReport) -> str | None:
        """Hand ``report`` over and wait until the trial answers; returns the stop reason, if
        the trial asked the run to stop."""
        if self.stop_reason is None:
            self._go.clear()
            self._reports.put(report)
            self._go.wait()
        return self.stop_reason

    def close(self) -> None:
        """The run has ended: no more reports."""
        self._reports.put(None)

    # -- the trial's side ---------------------------------------------------------------------
    def next_report(self) -> TrialReport | None:
        """The next report (the run waits there), or None once the run has ended."""
        return self._reports.get()

    def release(self) -> None:
        """Let the run go on from the report it waits at."""
        self._go.set()

    def stop(self, reason: str) -> None:
        """Ask the run to stop; a run waiting at a report is released so that it can."""
        self.stop_reason = reason
        self._go.set()


_CHANNELS: dict[str, ReportChannel] = {}


def open_channel(name: str) -> ReportChannel:
    """A fresh channel under ``name`` (a trial id), replacing an older one."""
    _CHANNELS[name] = ReportChannel()
    return _CHANNELS[name]


def get_channel(name: str) -> ReportChannel | None:
    return _CHANNELS.get(name)
