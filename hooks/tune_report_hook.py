"""TuneReportHook: each validation of a run a ``drun tune`` trial drives, reported to the trial,
which holds the run there until Tune has decided."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import DataBatch, Hook
from distributed_runner.tune.channel import ReportChannel, get_channel
from distributed_runner.tune.trial_run import TrialReport

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class TuneReportHook(Hook):
    """At ``after_val_epoch`` of training: the position (``epoch``, ``iter``), the metrics
    (bare and as ``val/<key>``), whether this is the run's last validation (``done``) and the
    checkpoint saved at this very position go to the trial's channel
    (:mod:`distributed_runner.tune.channel`); the run waits until the trial lets it go on.

    A stop the trial asks for (Tune stopped or paused the trial) becomes
    ``runner.request_stop(reason)``: the loop stops at its next agreement point — right after
    this validation —, ``after_train`` runs, the last checkpoint is written and the sinks close.
    A stop asked for between reports is taken up after the next iteration.

    The validation a resumed run repeats (its checkpoint was saved before a validation that was
    due) is not reported again: Tune has its result already.

    Added by ``drun tune`` to in-process trials' configs; not meant for a config. Ranks: the
    trial's run is one process.
    """

    priority = "LOWEST"  # after CheckpointHook has saved and pointed at this position

    def __init__(self, channel: str) -> None:
        self.channel_name = channel
        self._saved: tuple[int, Path] | None = None  # (iteration, file) of the newest save
        self._start_iter = 0
        self._stop_sent = False

    def _channel(self) -> ReportChannel:
        channel = get_channel(self.channel_name)
        if channel is None:
            raise ArgumentError(
                "channel", f"no trial channel {self.channel_name!r} in this process"
            )
        return channel

    def before_train(self, runner: RunnerAPI) -> None:
        self._channel()
        self._start_iter = runner.iter  # after a resume: the restored position

    def after_save_checkpoint(self, runner: RunnerAPI, path: Path, checkpoint: dict) -> None:
        iteration = int(checkpoint.get("meta", {}).get("iter", -1))
        if self._saved is None or self._saved[0] != iteration:  # the first file of a position
            self._saved = (iteration, Path(path))

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
    ) -> None:
        self._pass_on_stop(runner, self._channel().stop_reason)

    def after_val_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        if runner.train_loop is None or not metrics:
            return
        if runner.iter == self._start_iter and self._start_iter > 0:
            return  # the validation a resumed run repeats: reported before it was saved
        values: dict[str, Any] = {"epoch": runner.epoch, "iter": runner.iter}
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                values[key] = float(value)
                values[f"val/{key}"] = float(value)
        values["done"] = runner.iter >= runner.max_iters
        checkpoint = None
        if self._saved is not None and self._saved[0] == runner.iter and self._saved[1].is_file():
            checkpoint = str(self._saved[1])
        reason = self._channel().report(TrialReport(values, checkpoint))
        self._pass_on_stop(runner, reason)

    def _pass_on_stop(self, runner: RunnerAPI, reason: str | None) -> None:
        if reason is not None and not self._stop_sent:
            self._stop_sent = True
            runner.request_stop(reason)
