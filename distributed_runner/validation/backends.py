"""Where asynchronous validations run (rank 0 hands them over; :mod:`.async_validation` applies
them).

* :class:`ProcessBackend` (no Ray): one background process, ``python -m
  distributed_runner.launch.validation_worker``, started at the first validation and kept for the
  run. It reads one job per line on its stdin and writes each result to ``work_dir/async_val/
  result_{k}.json`` (renamed into place when whole); its own log goes to
  ``work_dir/async_val/worker.log``. Validations run one after another, in the order handed over.
* :class:`RayTrainBackend` (``--launcher ray``): Ray Train's own validation tasks
  (``ValidationConfig`` on the trainer, set by the launcher; RayReportHook reports a due
  checkpoint with ``validation=``). Ray runs them one at a time on resources outside the training
  workers and merges the metrics into the reported checkpoint's; rank 0 reads them back with
  ``ray.train.get_all_reported_checkpoints``. Nothing is handed over here: the report did it, and
  after a worker-group restart Ray's controller still holds the queue.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from distributed_runner.core.run_folders import FLAT

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI

FOLDER = "async_val"  # under work_dir: the validation process's files
PREFIX = "async_val/"  # the keys of validation results in Ray's checkpoint metrics
WAIT_NOTE_S = 60.0  # how often waiting for a result is logged


def make_backend(runner: RunnerAPI) -> ProcessBackend | RayTrainBackend:
    launcher = runner.launcher
    kind = launcher.get("type") if isinstance(launcher, dict) else launcher
    return RayTrainBackend(runner) if kind == "ray" else ProcessBackend(runner)


class ProcessBackend:
    """A background process validating checkpoints one after another (module docstring)."""

    def __init__(self, runner: RunnerAPI) -> None:
        self.runner = runner
        self.folder = Path(runner.work_dir) / FOLDER
        self.proc: subprocess.Popen | None = None
        self._log: IO[bytes] | None = None

    def _start(self) -> subprocess.Popen:
        import pickle

        from distributed_runner.core.config import to_plain

        self.folder.mkdir(parents=True, exist_ok=True)
        cfg_file = self.folder / "config.pkl"
        # rooted at the run's folder: the validating Runner writes under it, in no new run
        cfg = {**to_plain(dict(self.runner.cfg)), "work_dir": str(self.runner.work_dir)}
        cfg_file.write_bytes(pickle.dumps({**cfg, "run_name": FLAT}))
        root = str(Path(__file__).resolve().parents[1])  # the package's checkout
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (root, os.getcwd(), env.get("PYTHONPATH", "")) if p
        )
        self._log = open(self.folder / "worker.log", "ab")  # noqa: SIM115 - closed in close()
        return subprocess.Popen(
            [sys.executable, "-m", "distributed_runner.launch.validation_worker", str(cfg_file)],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )

    def _result_file(self, entry: dict) -> Path:
        return self.folder / f"result_{entry['k']}.json"

    def begin(self) -> subprocess.Popen:
        """Start the process: it imports and builds its Runner while training runs."""
        if self.proc is None:
            self.proc = self._start()
        return self.proc

    def submit(self, entry: dict, resumed: bool = False) -> None:
        proc = self.begin()
        self._result_file(entry).unlink(missing_ok=True)  # a killed run's, maybe
        job = {**entry, "result": str(self._result_file(entry))}
        assert proc.stdin is not None
        try:
            proc.stdin.write((json.dumps(job) + "\n").encode())
            proc.stdin.flush()
        except OSError:  # the process died: result() says so, and training goes on
            pass

    def result(self, entry: dict) -> dict:
        """Wait for validation ``entry``'s result: ``{'metrics', 'seconds'}`` or ``{'error'}``."""
        path, started, noted = self._result_file(entry), time.monotonic(), time.monotonic()
        while not path.is_file():
            if self.proc is None or self.proc.poll() is not None:
                code = None if self.proc is None else self.proc.returncode
                return {
                    "error": f"the validation process ended (status {code}); see "
                    f"{self.folder / 'worker.log'}"
                }
            if time.monotonic() - noted > WAIT_NOTE_S:
                noted = time.monotonic()
                self.runner.logger.info(
                    "waiting %.0f s for the asynchronous validation of %s",
                    noted - started,
                    Path(entry["path"]).name,
                )
            time.sleep(0.02)
        result = json.loads(path.read_text())
        path.unlink(missing_ok=True)
        return result

    def close(self, wait: bool = True) -> None:
        """End the process: after its current validation (``wait``), else at once."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()  # the worker ends after its current validation
            try:
                proc.wait(timeout=10 if wait else 0.001)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


class RayTrainBackend:
    """Ray Train's validation tasks (module docstring); rank 0 polls for their results."""

    def __init__(self, runner: RunnerAPI) -> None:
        self.runner = runner

    def begin(self) -> None:
        """Nothing to start: Ray's controller launches the tasks."""

    def submit(self, entry: dict, resumed: bool = False) -> None:
        """Nothing to do: RayReportHook's report asked Ray to validate the checkpoint."""

    def result(self, entry: dict) -> dict:
        import ray.train
        from ray.train.v2.api.reported_checkpoint import ReportedCheckpointStatus as Status

        name, started, noted = Path(entry["path"]).name, time.monotonic(), time.monotonic()
        while True:
            reported = ray.train.get_all_reported_checkpoints(
                consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
            )
            for rc in reported:  # the due checkpoint is the one at its iteration Ray validates
                if rc.metrics.get("iter") != entry["iter"]:
                    continue
                if rc.status in (Status.VALIDATION_FAILED, Status.VALIDATION_TIMEOUT):
                    return {"error": f"Ray: {rc.status.value} for {name} (see the driver's log)"}
                if rc.status == Status.VALIDATED:
                    metrics = {
                        k[len(PREFIX) :]: v
                        for k, v in rc.metrics.items()
                        if k.startswith(PREFIX) and k != PREFIX + "seconds"
                    }
                    return {"metrics": metrics, "seconds": rc.metrics.get(PREFIX + "seconds")}
            if time.monotonic() - noted > WAIT_NOTE_S:
                noted = time.monotonic()
                self.runner.logger.info(
                    "waiting %.0f s for Ray's validation of %s", noted - started, name
                )
            time.sleep(0.5)

    def close(self, wait: bool = True) -> None:
        """Ray's controller waits for its queue before ``fit()`` returns."""
