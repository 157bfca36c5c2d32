"""MLflowSink: one MLflow run per training run — across ranks, resumes, Ray restarts and reruns.

``LoggerHook(sinks=['terminal', dict(type='MLflowSink', tracking_uri=None, experiment=None)])``

* **One run.** The run is created at the first record of a fresh training run; its id is kept in
  LoggerHook's state (so in every checkpoint) and in ``work_dir/mlflow_run.json``. A run resumed
  from a checkpoint — ``--resume``, a Ray restart after a dead worker, a driver rerun with the same
  name — logs into the same MLflow run. Only rank 0 talks to MLflow.
* **No duplicated or missing steps.** Records are flushed to MLflow before each checkpoint is
  saved; on resume the sink asks MLflow which (metric, step) pairs it already has and skips them,
  so the steps a crashed run logged after its last checkpoint are not logged twice (an exact
  resume recomputes the same values).
* **Never stalls a step.** Metrics go to a sender process (:mod:`.mlflow_sender`) that buffers
  them (bounded) and sends them with ``log_batch`` every ``flush_interval`` seconds, up to 1,000 a
  call — a process, so MLflow's Python never competes with the training loop for the GIL. When
  the server is unreachable training goes on: the sender warns once, keeps the buffered metrics
  and sends them when the server answers again; beyond ``max_buffer`` it drops the oldest and
  says how many.
* **What a run holds.** Params: the flattened config with secret-looking values redacted. Tags:
  world size, launcher, Ray run name, git commit (when the config lives in a git checkout).
* ``tracking_uri``: the config value, else ``MLFLOW_TRACKING_URI``, else a SQLite store in
  ``work_dir/mlflow.db``. ``experiment``: default the run's ``experiment_name``.
"""
from __future__ import annotations

import itertools
import json
import logging
import multiprocessing
import os
import queue
import subprocess
import time
from pathlib import Path
from typing import Any

from ..config import to_plain
from ..log import LOGGER_NAME
from ..redact import flatten, redact
from ..registry import LOG_SINKS
from .base import LogRecord, LogSink
from .mlflow_sender import sender_main

logger = logging.getLogger(LOGGER_NAME)
RUN_FILE = "mlflow_run.json"


def _git_commit(folder: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True,
                             text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _ray_job_id() -> str | None:
    """The Ray job this process belongs to (``ray job submit``), if any."""
    try:
        import ray
        if ray.is_initialized():
            return ray.get_runtime_context().get_job_id()
    except Exception:
        return None
    return None


@LOG_SINKS.register_module()
class MLflowSink(LogSink):
    """See the module docstring."""

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = None,
                 run_name: str | None = None, max_buffer: int = 100_000,
                 flush_interval: float = 2.0, close_timeout: float = 60.0,
                 log_params: bool = True) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.max_buffer = int(max_buffer)
        self.flush_interval = float(flush_interval)
        self.close_timeout = float(close_timeout)
        self.log_params = log_params
        self.run_id: str | None = None  # restored from a checkpoint through LoggerHook
        self.dropped = 0
        self._process: Any = None
        self._ids = itertools.count()
        self._pending: list[tuple] = []
        self._handed = 0.0

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, runner: Any) -> None:
        self.work_dir = Path(runner.work_dir)
        self.uri = (self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
                    or f"sqlite:///{self.work_dir / 'mlflow.db'}")
        tags = {"world_size": str(runner.world_size),
                "launcher": runner.launcher if isinstance(runner.launcher, str) else "ray",
                "experiment_name": runner.experiment_name}
        launcher = runner.cfg.get("launcher") if hasattr(runner.cfg, "get") else None
        if isinstance(launcher, dict) and launcher.get("name"):
            tags["ray_run_name"] = str(launcher["name"])
        job_id = _ray_job_id()
        if job_id:
            tags["ray_job_id"] = job_id
        config_file = getattr(runner.cfg, "filename", None)
        commit = _git_commit(Path(config_file).parent) if config_file else None
        if commit:
            tags["git_commit"] = commit
        experiment = self.experiment or runner.experiment_name
        # plain strings only: the sender is another process, and a config may hold objects
        params = {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
                  for k, v in flatten(redact(to_plain(runner.cfg))).items()}
        self._run_info = {"experiment": experiment, "run_name": self.run_name or experiment,
                          "tags": tags, "params": params if self.log_params else None}
        ctx = multiprocessing.get_context("spawn")
        self._inbox, self._outbox = ctx.Queue(), ctx.Queue()
        settings = {"max_buffer": self.max_buffer, "flush_interval": self.flush_interval}
        self._process = ctx.Process(target=sender_main, name="mlflow-sender", daemon=True,
                                    args=(self.uri, settings, self._inbox, self._outbox))
        self._process.start()

    def _request(self, command: str, *args: Any, timeout: float = 120.0) -> Any:
        """Ask the sender process; raises RuntimeError with its error, or on no answer."""
        self._hand_over()  # metrics first: a flush or close covers everything written so far
        request_id = next(self._ids)
        self._inbox.put((request_id, command, args))
        end = time.monotonic() + timeout
        while True:
            try:
                answer_id, ok, result = self._outbox.get(timeout=max(end - time.monotonic(), 0))
            except queue.Empty:
                raise RuntimeError(f"no answer from the MLflow sender to {command!r}") from None
            if answer_id == request_id:
                if not ok:
                    raise RuntimeError(result)
                return result

    def state_dict(self) -> dict:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict) -> None:
        self.run_id = state.get("run_id") or self.run_id

    def _ensure_run(self) -> None:
        """Once, at the first record: the run must exist before a checkpoint records its id, or a
        resume would start a second run. Restored runs are adopted, new ones created."""
        self._run_opened = True
        try:
            self._adopt(self._request("ensure_run", self.run_id, self._run_info, timeout=60))
        except RuntimeError as e:
            logger.warning("MLflow at %s is unreachable (%s); training goes on, metrics are "
                           "buffered and the run is opened when the server answers", self.uri, e)

    def _adopt(self, run_id: str | None) -> None:
        """Record the run id the sender reports (in LoggerHook's state and work_dir)."""
        if run_id is None or run_id == self.run_id and (self.work_dir / RUN_FILE).is_file():
            return
        self.run_id = run_id
        (self.work_dir / RUN_FILE).write_text(json.dumps(
            {"run_id": run_id, "tracking_uri": self.uri,
             "experiment": self._run_info["experiment"]}))
        logger.info("MLflow run %s in experiment %r at %s", run_id,
                    self._run_info["experiment"], self.uri)

    # -- records -------------------------------------------------------------------------------
    def write(self, record: LogRecord) -> None:
        if self._process is None:
            return
        if not getattr(self, "_run_opened", False):
            self._ensure_run()
        now = int(time.time() * 1000)
        self._pending.extend((f"{record.mode}/{k}", float(v), now, record.step)
                             for k, v in record.scalars.items())
        # hand over in chunks: one queue message per ~second, not one per step
        if len(self._pending) >= 1000 or time.monotonic() - self._handed > 1.0:
            self._hand_over()

    def _hand_over(self) -> None:
        if self._pending:
            self._inbox.put(("m", self._pending))
            self._pending = []
        self._handed = time.monotonic()

    def flush(self) -> None:
        """Before a checkpoint: give the sender a few seconds to send what it holds, so a resumed
        run finds every step up to its checkpoint in MLflow (it never waits longer)."""
        if self._process is not None and getattr(self, "_run_opened", False):
            try:
                self._adopt(self._request("flush", 5.0, timeout=30))
            except RuntimeError as e:
                logger.warning("MLflow: flush before the checkpoint failed (%s)", e)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file (a checkpoint) to the run."""
        if not getattr(self, "_run_opened", False):
            self._ensure_run()
        self._request("artifact", str(path), artifact_path, timeout=600)

    def close(self) -> None:
        if self._process is None:
            return
        try:
            summary = self._request("close", self.close_timeout, timeout=self.close_timeout + 60)
        except RuntimeError as e:
            summary = None
            logger.warning("MLflow sender did not finish (%s)", e)
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.terminate()
        self._process = None
        if summary:
            self._adopt(summary["run_id"])
            self.dropped = summary["dropped"]
            if summary["unsent"]:
                logger.warning("MLflow: %d metrics could not be sent before the run ended",
                               summary["unsent"])
            if summary["dropped"]:
                logger.warning("MLflow: %d metrics were dropped (buffer of %d full while the "
                               "server was unreachable)", summary["dropped"], self.max_buffer)
