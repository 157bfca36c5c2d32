"""The Tune trial: a class ``tune.Trainable`` that drives one run through a
:class:`~.trial_run.TrialRun`.

A class, not a function trainable: Tune ends a stopped function trainable by raising
``SystemExit`` inside ``tune.report`` and the process dies within a second — ``after_train``
never finishes, no last checkpoint, the MLflow run stays RUNNING (measured on Ray 2.60). A class
Trainable gets ``cleanup()`` with a window before Tune frees its resources; here that window is
the run's own graceful stop (``request_stop``, then up to ``stop_grace_s`` for it to end).

* ``setup``: the trial's values; nothing starts yet (``load_checkpoint`` may follow).
* ``load_checkpoint``: Tune hands back a checkpoint :meth:`save_checkpoint` wrote — this trial's
  (a paused or interrupted trial resumes exactly) or, under PBT, another trial's (an exploit: the
  run resumes from the donor's file and :class:`hooks.tune_fork_hook.TuneForkHook` applies this
  trial's own values; the trial keeps its work_dir and MLflow run).
* ``step``: the first starts the run — from the checkpoint Tune handed back, else from the
  trial's own newest file if it has one; each returns the next result of the run, which waits
  there until the next ``step`` (or ``cleanup``) lets it go on; ``should_checkpoint`` when the
  result has its checkpoint.
* ``save_checkpoint``: the result's checkpoint file (hard-linked) plus ``drun_tune.json``
  (trial id, position, the trial's values) — what an exploit needs to know whose run it takes.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ray import tune

from distributed_runner.checkpoint.files import checksum_path
from distributed_runner.checkpoint.resume_choice import newest_verified
from distributed_runner.tune.in_process import InProcessTrialRun
from distributed_runner.tune.mutations import MUTABLE_KEYS
from distributed_runner.tune.trial_config import trial_config
from distributed_runner.tune.trial_run import TrialReport, TrialRun

_LOG = logging.getLogger("distributed_runner.tune")

STATE_FILE = "drun_tune.json"
FORKS_FILE = "tune_forks.jsonl"  # one line per exploit this trial made: where it came from
STOP_REASON = "tune: trial stopped or paused by the scheduler"


def ray_trial_api() -> Any:
    """:mod:`.ray_trial` (``trial_launcher='ray'``: ``RayTrainTrialRun``, ``ray_trial_resources``,
    ``ray_trial_footprint``, ``ray_trials_that_fit``), imported only when a sweep runs trials on
    Ray Train."""
    return importlib.import_module(f"{__package__}.ray_trial")


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class DrunTrainable(tune.Trainable):
    """See the module docstring. ``sweep`` (given with ``tune.with_parameters``): ``base`` (the
    plain base config), ``work_dir``, ``trial_launcher``, ``stop_grace_s``, ``mlflow`` (None, or
    where trials' MLflow runs go)."""

    def setup(self, config: dict, sweep: dict | None = None) -> None:
        assert sweep is not None, "DrunTrainable needs tune.with_parameters(sweep=...)"
        self.sweep = sweep
        self.values = dict(config)
        self.trial_dir = Path(sweep["work_dir"]) / "trials" / self.trial_id
        self.trial_dir.mkdir(parents=True, exist_ok=True)
        self.resume_from: str | None = None
        self.fork: dict[str, Any] | None = None
        self.run: TrialRun | None = None
        self.last: TrialReport | None = None
        self.finished = False

    # -- the run -------------------------------------------------------------------------------
    def _own_mlflow_run(self) -> str | None:
        path = self.trial_dir / "mlflow_run.json"
        try:
            return json.loads(path.read_text())["run_id"]
        except (OSError, ValueError, KeyError):
            return None

    def _make_run(self) -> TrialRun:
        cfg = trial_config(
            self.sweep["base"],
            self.values,
            self.trial_id,
            str(self.trial_dir),
            mlflow=self.sweep.get("mlflow"),
            resume=self.resume_from,
            fork=self.fork,
            mlflow_run_id=self._own_mlflow_run(),
        )
        if self.sweep["trial_launcher"] == "ray":
            run: TrialRun = ray_trial_api().RayTrainTrialRun(cfg, self.trial_id)
            return run
        cfg["launcher"] = "none"
        return InProcessTrialRun(cfg, self.trial_id)

    def step(self) -> dict:
        if self.run is None:
            if self.resume_from is None:
                # restarted without a Tune checkpoint (the sweep was cut after the run wrote a
                # file but before Tune persisted it): the trial's own newest file is as exact
                own = newest_verified(self.trial_dir, _LOG)
                self.resume_from = str(own) if own is not None else None
            self.run = self._make_run()
            self.run.start()
        else:
            self.run.resume_after_report()
        report = self.run.next_report()
        if report is None:  # the run ended without another result
            self.finished = True
            return {**(self.last.metrics if self.last else {}), "done": True}
        self.last = report
        result = dict(report.metrics)
        self.finished = bool(result.get("done"))
        result["should_checkpoint"] = report.checkpoint is not None
        return result

    def cleanup(self) -> None:
        """Tune stopped or paused the trial, or it finished: let the run end gracefully."""
        if self.run is None:
            return
        if self.finished:
            self.run.resume_after_report()
        else:
            self.run.request_stop(STOP_REASON)
        if not self.run.wait(self.sweep["stop_grace_s"]):
            print(
                f"drun tune: trial {self.trial_id} did not end within stop_grace_s="
                f"{self.sweep['stop_grace_s']:g} s of its stop request",
                flush=True,
            )

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, checkpoint_dir: str) -> None:
        report = self.last
        state: dict[str, Any] = {"trial_id": self.trial_id, "values": self.values, "file": None}
        if report is not None:
            state.update(iter=report.metrics.get("iter"), epoch=report.metrics.get("epoch"))
            if report.checkpoint is not None:
                source = Path(report.checkpoint)
                _link_or_copy(source, Path(checkpoint_dir) / source.name)
                crc = checksum_path(source)
                if crc.is_file():
                    _link_or_copy(crc, Path(checkpoint_dir) / crc.name)
                state["file"] = source.name
        (Path(checkpoint_dir) / STATE_FILE).write_text(json.dumps(state, default=repr))

    def load_checkpoint(self, checkpoint: Any) -> None:
        folder = Path(checkpoint)
        state = json.loads((folder / STATE_FILE).read_text())
        if not state.get("file"):
            return  # saved before the first result: the trial starts afresh
        # Tune's folder may be temporary: the file goes into the trial's own work_dir
        target_dir = self.trial_dir / "tune_restore"
        target_dir.mkdir(exist_ok=True)
        name = f"{state['trial_id']}-{state['file']}"
        source = folder / state["file"]
        shutil.copy2(source, target_dir / name)
        crc = checksum_path(source)
        if crc.is_file():
            shutil.copy2(crc, checksum_path(target_dir / name))
        self.resume_from = str(target_dir / name)
        if state["trial_id"] == self.trial_id:
            self.fork = None
            return
        donor_values = state.get("values") or {}
        changes = {
            key: [donor_values[key], self.values[key]]
            for key in MUTABLE_KEYS
            if key in self.values and key in donor_values
        }
        self.fork = {"donor": state["trial_id"], "iteration": state.get("iter"), "changes": changes}
        line = {"time": time.time(), **self.fork}
        # the trial's newest good file: its bookkeeping is kept
        own = newest_verified(self.trial_dir, _LOG)
        if own is not None:
            self.fork["own_checkpoint"] = str(own)
        with open(self.trial_dir / FORKS_FILE, "a") as f:
            f.write(json.dumps(line) + "\n")
        print(
            f"drun tune: trial {self.trial_id} continues trial {state['trial_id']}'s run from "
            f"iteration {state.get('iter')} with "
            + ", ".join(f"{k}={v[1]!r} (donor {v[0]!r})" for k, v in changes.items()),
            flush=True,
        )
