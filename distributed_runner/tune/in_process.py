"""``trial_launcher='none'``: the trial's run is a Runner in a thread of the trial's process.

The thread trains; :class:`hooks.tune_report_hook.TuneReportHook` hands every validation's
result to the trial through a :class:`~.channel.ReportChannel` and holds the run until the trial
releases it. A stop is the Runner's own rank-agreed stop request, so the run ends as any stopped
run does: ``after_train`` (last checkpoint), ``after_run``, sinks closed (MLflow ``FINISHED``).
"""

from __future__ import annotations

import threading

from distributed_runner.engine.runner import Runner
from distributed_runner.tune.channel import open_channel
from distributed_runner.tune.trial_config import with_report_hook
from distributed_runner.tune.trial_run import TrialReport


class InProcessTrialRun:
    """A :class:`~.trial_run.TrialRun` training ``cfg`` (a trial's plain config) in a thread."""

    def __init__(self, cfg: dict, trial_id: str) -> None:
        self.trial_id = trial_id
        self.cfg = with_report_hook(cfg, trial_id)
        self.channel = open_channel(trial_id)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _main(self) -> None:
        try:
            Runner.from_cfg(self.cfg).train()
        except BaseException as e:  # noqa: BLE001 - handed to the trial, which raises it
            self._error = e
        finally:
            self.channel.close()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._main, name=f"drun-trial-{self.trial_id}", daemon=True
        )
        self._thread.start()

    def next_report(self) -> TrialReport | None:
        report = self.channel.next_report()
        if report is None:
            self.channel.close()  # later calls see the end too
            if self._error is not None:
                raise self._error
        return report

    def resume_after_report(self) -> None:
        self.channel.release()

    def request_stop(self, reason: str) -> None:
        self.channel.stop(reason)

    def wait(self, timeout_s: float) -> bool:
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()
