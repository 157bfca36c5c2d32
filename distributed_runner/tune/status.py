"""Which trials ended, as the sweep's driver saw them — kept in ``work_dir/tune_status.json``.

Tune's own trial status cannot tell an interrupted sweep from a finished one: on Ctrl-C it stops
the running trials and marks them ``TERMINATED`` like the ones that completed. A trial that
completed (its run ended, or the scheduler stopped it) or failed is reported to a callback
first; one the interruption stopped is not. The file carries the statuses across ``--resume``
(Tune restores the callback from its own state, and the trials finished before are not reported
again), so the callback merges into the file rather than keeping them in memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ray import tune

STATUS_FILE = "tune_status.json"
UNFINISHED = "INTERRUPTED"


def read_statuses(work_dir: Path) -> dict[str, str]:
    """Trial id -> ``TERMINATED``/``ERROR`` for the trials that ended (absent: unfinished)."""
    path = Path(work_dir) / STATUS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


class TrialStatusCallback(tune.Callback):
    """Records ``TERMINATED``/``ERROR`` per trial id as Tune reports them."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = Path(work_dir)

    def _set(self, trial: Any, status: str) -> None:
        statuses = read_statuses(self.work_dir)
        statuses[trial.trial_id] = status
        (self.work_dir / STATUS_FILE).write_text(json.dumps(statuses))

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._set(trial, "TERMINATED")

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._set(trial, "ERROR")
