"""A sweep trial run on Ray Train (``trial_launcher='ray'``): the :class:`TrialRun` that starts the
config's ``TorchTrainer`` (the ordinary :class:`~distributed_runner.launch.launcher.RayLauncher`)
from inside the Tune trial's actor.

How the pieces meet:

* ``fit()`` runs in a thread of the trial's process; the controller and the workers are Ray
  Train's own. The workers' placement group is the trainer's, outside Tune's accounting, so the
  trial actor asks for no CPU and the sweep limits concurrency from the whole footprint
  (:mod:`.ray_trial_resources`).
* Each (re)start of a trial is a fresh Train run, ``<trial_id>-g<N>`` under
  ``work_dir/ray_storage`` (the trial's own work_dir): Ray Train would otherwise resume the
  trial's older lineage from its storage in preference to the checkpoint the config names (a PBT
  fork's ``resume=`` donor file).
* Reports, holds and stops go through a 0-CPU :class:`.ray_trial_signal.TrialSignal` actor that
  the workers' :class:`hooks.ray_trial_hook.RayTrialHook` finds by name: rank 0 reports every
  validation with a checkpoint of that exact state, all ranks wait there until
  :meth:`RayTrainTrialRun.resume_after_report`, and :meth:`RayTrainTrialRun.request_stop`
  becomes ``runner.request_stop`` on rank 0 within ``poll_s`` seconds (or at once when held).
* The Train controller polls the workers every 0.25 s (Train's default is 2 s, which each second
  ``ray.train.report`` of an epoch waits out: see :data:`TRAIN_POLL_S`), unless
  ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` is set.
* The reported checkpoint is rank 0's file in the trial's work_dir; a multi-node sweep keeps the
  trials' work_dirs on shared storage, as the trial actor reads it from its own node.
"""

from __future__ import annotations

import copy
import os
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from distributed_runner.core.storage import is_remote
from distributed_runner.launch.launcher import RayLauncher
from distributed_runner.tune.ray_trial_resources import (
    ray_launcher_opts,
    ray_trial_footprint,
    ray_trial_resources,
    ray_trials_that_fit,
)
from distributed_runner.tune.ray_trial_signal import TrialSignal
from distributed_runner.tune.trial_run import TrialReport

__all__ = [
    "RayTrainTrialRun",
    "ray_trial_footprint",
    "ray_trial_resources",
    "ray_trials_that_fit",
]

POLL_S = 0.5  # how often rank 0 looks for a stop, at most (a look is free: ray.wait(timeout=0))
# How often the Train controller polls the workers, unless RAY_TRAIN_HEALTH_CHECK_INTERVAL_S is
# set. A worker's ray.train.report (RayReportHook, every saved checkpoint) waits until the
# controller has taken the previous one, and a trial saves twice at many validations (the
# periodic and the best file): with Train's default of 2 s, an epoch of the digits sweep took
# 2.5-3.9 s instead of 0.33-0.40 s, and the 4-trial ASHA sweep 96 s instead of 49 s (measured).
TRAIN_POLL_S = "0.25"
HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def next_generation(storage_path: str, trial_id: str) -> int:
    """1 + the highest ``<trial_id>-g<N>`` Train run already under a local ``storage_path`` (1
    for a remote one, whose listing is not worth a round trip: the suffix then only has to be
    unique, which the caller's timestamp fallback keeps)."""
    root = Path(storage_path)
    if is_remote(storage_path) or not root.is_dir():
        return 1
    pattern = re.compile(rf"^{re.escape(trial_id)}-g(\d+)$")
    found = [int(m.group(1)) for p in root.iterdir() if (m := pattern.match(p.name))]
    return max(found, default=0) + 1


class RayTrainTrialRun:
    """One trial's run on Ray Train (see the module docstring); implements
    :class:`~distributed_runner.tune.trial_run.TrialRun`.

    ``cfg`` is the trial's plain config (its ``work_dir`` the trial's own, its ``launcher`` a Ray
    launcher); ``trial_id`` names the Train run. Requires a connected Ray (the trial actor's).
    """

    def __init__(self, cfg: dict, trial_id: str, poll_s: float = POLL_S) -> None:
        opts = ray_launcher_opts(cfg)
        self.cfg = copy.deepcopy(cfg)
        self.trial_id = str(trial_id)
        self.poll_s = float(poll_s)
        storage = opts["storage_path"] or str(Path(self.cfg["work_dir"]) / "ray_storage")
        if is_remote(storage):  # no cheap listing: a time-ordered unique suffix instead
            self.name = f"{self.trial_id}-t{time.time_ns()}"
        else:
            self.name = f"{self.trial_id}-g{next_generation(storage, self.trial_id)}"
        self.opts = {**opts, "name": self.name, "storage_path": storage}
        self.signal_name = f"drun-trial-{self.trial_id}-{uuid.uuid4().hex[:8]}"
        self.result: Any = None  # Ray's Result once fit() returned
        self._signal: Any = None
        self._namespace: str | None = None
        self._thread: threading.Thread | None = None
        self._ended = threading.Event()
        self._error: BaseException | None = None
        self._report_ref: Any = None  # the one outstanding take_report call
        self._held: int | None = None  # the iteration of the report the run is held at

    # -- TrialRun ------------------------------------------------------------------------------
    def start(self) -> None:
        """Create the signal actor, then run the trainer's ``fit()`` in a thread."""
        import ray

        self._namespace = ray.get_runtime_context().namespace
        # owned by this process: it dies with the trial actor if Tune kills it
        self._signal = (
            ray.remote(TrialSignal)
            .options(name=self.signal_name, namespace=self._namespace, num_cpus=0)
            .remote()
        )
        cfg = copy.deepcopy(self.cfg)
        hooks = list(cfg.get("custom_hooks") or [])
        hooks.append(
            {
                "type": "RayTrialHook",
                "name": "ray_trial",
                "signal": self.signal_name,
                "namespace": self._namespace,
                "poll_s": self.poll_s,
            }
        )
        cfg["custom_hooks"] = hooks
        cfg["launcher"] = self.opts
        # read when the trainer starts its controller, which passes it on (this process is the
        # trial's own under Tune)
        os.environ.setdefault(HEALTH_CHECK_ENV, TRAIN_POLL_S)
        launcher = RayLauncher(cfg, self.opts)
        self._thread = threading.Thread(
            target=self._fit, args=(launcher,), name=f"drun-trial-{self.trial_id}", daemon=True
        )
        self._thread.start()

    def next_report(self) -> TrialReport | None:
        """The run's next report (the run is held there), ``None`` once it has ended; raises the
        run's error when it failed."""
        import ray

        if self._signal is None:
            if self._thread is None:
                raise RuntimeError("RayTrainTrialRun.next_report before start()")
            if self._error is not None:  # asked again after the end
                raise self._error
            return None
        while True:
            if self._report_ref is None:
                self._report_ref = self._signal.take_report.remote()
            # a report is put before its run holds, so a run that ended left none behind
            # unless it was stopped; look once more after it ended to be sure
            ended = self._ended.is_set()
            ready, _ = ray.wait([self._report_ref], timeout=0.5 if ended else 0.2)
            if ready:
                index, metrics, checkpoint = ray.get(self._report_ref)
                self._report_ref = None
                self._held = index
                return TrialReport(metrics=metrics, checkpoint=checkpoint)
            if ended:
                self._close()
                if self._error is not None:
                    raise self._error
                return None

    def resume_after_report(self) -> None:
        """Let the run go on from the report it is held at."""
        import ray

        if self._signal is not None and self._held is not None:
            ray.get(self._signal.release.remote(self._held))
            self._held = None

    def request_stop(self, reason: str) -> None:
        """Ask rank 0 to request a stop (the loop's own, agreed by all ranks); a held run is
        released so that it can."""
        import ray

        if self._signal is not None and not self._ended.is_set():
            ray.get(self._signal.stop.remote(str(reason)))

    def wait(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for ``fit()`` to return (the worker group and its placement
        group are shut down by then); ``True`` when it has."""
        if self._thread is None:
            return True
        self._thread.join(timeout=max(0.0, timeout_s))
        if self._thread.is_alive():
            return False
        self._close()
        return True

    # -- internals -----------------------------------------------------------------------------
    @property
    def error(self) -> BaseException | None:
        """The run's failure, once it ended (``ray.train.TrainingFailedError`` from the workers)."""
        return self._error

    def _fit(self, launcher: RayLauncher) -> None:
        try:
            self.result = launcher.fit()
        except BaseException as e:  # noqa: BLE001 - handed to next_report's caller
            self._error = e
        finally:
            self._ended.set()

    def _close(self) -> None:
        """Drop the signal actor once the run has ended (the workers no longer need it)."""
        import ray

        if self._signal is not None and self._ended.is_set():
            ray.kill(self._signal, no_restart=True)
            self._signal = None
            self._report_ref = None
