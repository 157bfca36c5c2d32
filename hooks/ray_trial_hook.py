"""RayTrialHook: a Ray Train worker's side of a sweep trial — reports each validation to the
trial, holds there until Tune has decided, and turns the trial's stop into the run's own stop
request."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class RayTrialHook(Hook):
    """Added by a Ray Train sweep trial (:mod:`distributed_runner.tune.ray_trial`) to its
    workers' hooks; not meant for a config. ``signal`` names the trial's
    :class:`~distributed_runner.tune.ray_trial_signal.TrialSignal` actor.

    * ``after_val_epoch`` (every rank, after CheckpointHook and early stopping): a checkpoint of
      this very state is saved (``runner.save_requested_checkpoint``: nothing new is written when
      the periodic checkpoint of this position already was, as a sweep configures it), rank 0
      sends the position, the metrics (``val/<key>`` and the bare ``<key>``), ``done`` (the run's
      last validation) and the file to the trial, and every rank waits until the trial releases
      the report. So the run is *held* while Tune decides and saves: Tune's checkpoint is exactly
      the state at the result (a PBT pause or fork resumes exactly). The validation a resumed run
      repeats (its checkpoint was saved before a validation that was due) is not reported again.
    * a stop (from the trial, at any time): rank 0 keeps one ``wait_stop`` call outstanding and
      looks at it with ``ray.wait(timeout=0)`` after an iteration at most every ``poll_s``
      seconds, so the loop never stalls on it; a stop also releases a held report. Either way rank
      0 calls ``runner.request_stop(reason)`` and all ranks agree at the next agreement point
      (``train_cfg.agree_every``, and always right after a validation): ``after_train`` runs, the
      last checkpoint is written and the sinks close.
    """

    priority = "LOWEST"

    def __init__(self, signal: str, namespace: str | None = None, poll_s: float = 0.5) -> None:
        if not isinstance(signal, str) or not signal:
            raise ValueError("RayTrialHook needs the trial's signal actor name")
        self.signal = signal
        self.namespace = namespace
        self.poll_s = float(poll_s)
        self._actor: Any = None
        self._stop_ref: Any = None  # rank 0's one outstanding wait_stop call
        self._next_poll = 0.0
        self._start_iter = 0

    def before_train(self, runner: RunnerAPI) -> None:
        import ray

        try:
            self._actor = ray.get_actor(self.signal, namespace=self.namespace)
        except ValueError as e:
            raise RuntimeError(
                f"RayTrialHook: the trial's signal actor {self.signal!r} is gone "
                f"(its trial ended?): {e}"
            ) from e
        self._start_iter = runner.iter  # after a resume: the restored position
        if runner.rank == 0:
            self._stop_ref = self._actor.wait_stop.remote()

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: Any = None,
        outputs: dict | None = None,
    ) -> None:
        if self._stop_ref is None:
            return
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + self.poll_s
        import ray

        ready, _ = ray.wait([self._stop_ref], timeout=0)
        if ready:
            self._request_stop(runner, ray.get(self._stop_ref))

    def after_val_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        if self._actor is None:  # a validation outside training (Runner.val)
            return
        if runner.iter == self._start_iter > 0:
            return  # the validation a resumed run repeats: Tune has this result already
        import ray

        path = runner.save_requested_checkpoint("tune report")  # every rank: it is collective
        if runner.rank == 0:
            report: dict[str, Any] = {"epoch": runner.epoch, "iter": runner.iter}
            for key, value in (metrics or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    report[f"val/{key}"] = report[key] = float(value)
            report["done"] = runner.iter >= runner.max_iters  # the run's last result
            ray.get(self._actor.put_report.remote(runner.iter, report, str(path)))
        # every rank holds here; the report's iteration is the same on every rank
        reason = ray.get(self._actor.wait_released.remote(runner.iter))
        if reason is not None:
            self._request_stop(runner, reason)

    def _request_stop(self, runner: RunnerAPI, reason: str) -> None:
        """Rank 0 only, once: the trial's stop becomes the run's stop request."""
        if runner.rank != 0 or self._stop_ref is None:
            return
        self._stop_ref = None
        runner.request_stop(reason)
