"""The seam between a Tune trial and the run it drives, whichever way the run is launched.

A trial (:mod:`distributed_runner.tune`) holds one :class:`TrialRun`: the Runner in a thread of
the trial's own process (``trial_launcher='none'``) or a Ray Train ``TorchTrainer`` started from
it (``trial_launcher='ray'``). Both behave the same way towards Tune:

* the run is *held* at each report until the trial lets it go on, so the checkpoint Tune keeps
  for a result is the run's state at that result (a PBT pause or an exploit then resumes exactly);
* a stop is a request, never a kill: the run stops at its next agreement point, ``after_train``
  runs, the last checkpoint is written and the sinks close, as for any stop request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class TrialReport:
    """One result of a run: what Tune's scheduler and searcher see, and the checkpoint behind it.

    ``metrics`` holds ``epoch``, ``iter`` and the latest validation as ``val/<key>`` (and the
    bare ``<key>``); ``checkpoint`` is the checkpoint file written for this result, a path the
    trial's process can read (``None`` when the run reported without one).
    """

    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None


class TrialRun(Protocol):
    """A run a trial drives; see the module docstring for the contract."""

    def start(self) -> None:
        """Start the run in the background; returns at once."""

    def next_report(self) -> TrialReport | None:
        """Block until the run's next report (the run is then held there), or return ``None``
        when the run has ended; raise the run's own exception when it failed."""

    def resume_after_report(self) -> None:
        """Let the run go on from the report it is held at."""

    def request_stop(self, reason: str) -> None:
        """Ask the run to stop gracefully (``reason`` is logged as the stop's requester); a run
        held at a report is released so that it can."""

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the run to end; ``True`` when it has ended."""
