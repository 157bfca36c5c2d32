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
* **Never stalls a step.** Metrics go into a bounded buffer that a background thread sends with
  ``log_batch`` (up to 1,000 metrics a call). When the server is unreachable training goes on: the
  sink warns once, keeps the buffered metrics and sends them when the server answers again;
  beyond ``max_buffer`` it drops the oldest and says how many.
* **What a run holds.** Params: the flattened config with secret-looking values redacted. Tags:
  world size, launcher, Ray run name, git commit (when the config lives in a git checkout).
* ``tracking_uri``: the config value, else ``MLFLOW_TRACKING_URI``, else a SQLite store in
  ``work_dir/mlflow.db``. ``experiment``: default the run's ``experiment_name``.
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from ..config import to_plain
from ..redact import flatten, redact
from ..registry import LOG_SINKS
from .base import LogRecord, LogSink

logger = logging.getLogger("distributed_runner")
RUN_FILE = "mlflow_run.json"
_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


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
        self._buffer: deque = deque()
        self._lock = threading.Condition()
        self._run_lock = threading.Lock()
        self._inflight = 0
        self._thread: threading.Thread | None = None
        self._stop = False
        self._warned = False
        self._deadline = 0.0
        self._flush_wanted = False
        self._logged: set[tuple[str, int]] = set()  # (key, step) MLflow already had on resume
        self.client: Any = None

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, runner: Any) -> None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # we retry, not mlflow
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow.tracking import MlflowClient

        self.work_dir = Path(runner.work_dir)
        uri = (self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
               or f"sqlite:///{self.work_dir / 'mlflow.db'}")
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        self._runner_info = {
            "experiment": self.experiment or runner.experiment_name,
            "config": redact(to_plain(runner.cfg)),
            "tags": {"world_size": str(runner.world_size), "launcher": str(
                runner.launcher if isinstance(runner.launcher, str) else "ray"),
                "experiment_name": runner.experiment_name},
            "config_file": getattr(runner.cfg, "filename", None),
        }
        launcher = runner.cfg.get("launcher") if hasattr(runner.cfg, "get") else None
        if isinstance(launcher, dict) and launcher.get("name"):
            self._runner_info["tags"]["ray_run_name"] = str(launcher["name"])
        job_id = _ray_job_id()
        if job_id:
            self._runner_info["tags"]["ray_job_id"] = job_id
        self._stop = False
        self._thread = threading.Thread(target=self._sender, name="mlflow-sink", daemon=True)
        self._thread.start()

    def state_dict(self) -> dict:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict) -> None:
        self.run_id = state.get("run_id") or self.run_id

    def _ensure_run(self) -> str:
        """The MLflow run: the one the checkpoint names, or a new one (parameters and tags)."""
        with self._run_lock:
            return self._ensure_run_locked()

    def _ensure_run_locked(self) -> str:
        if self.run_id is not None and not hasattr(self, "_run_checked"):
            self._run_checked = True
            self._logged = self._already_logged(self.run_id)
            self.client.update_run(self.run_id, status="RUNNING")
            return self.run_id
        if self.run_id is not None:
            return self.run_id
        info = self._runner_info
        experiment = self.client.get_experiment_by_name(info["experiment"])
        experiment_id = experiment.experiment_id if experiment else \
            self.client.create_experiment(info["experiment"])
        tags = dict(info["tags"])
        if info["config_file"]:
            commit = _git_commit(Path(info["config_file"]).parent)
            if commit:
                tags["git_commit"] = commit
        run = self.client.create_run(experiment_id, run_name=self.run_name or info["experiment"],
                                     tags=tags)
        self.run_id = run.info.run_id
        self._run_checked = True
        if self.log_params:
            self._log_params(info["config"])
        (self.work_dir / RUN_FILE).write_text(json.dumps(
            {"run_id": self.run_id, "experiment_id": experiment_id, "tracking_uri": self.uri}))
        logger.info("MLflow run %s in experiment %r at %s", self.run_id, info["experiment"],
                    self.uri)
        return self.run_id

    def _log_params(self, config: dict) -> None:
        from mlflow.entities import Param

        params = [Param(_KEY_CHARS.sub("_", k)[:250], str(v)[:6000])
                  for k, v in flatten(config).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def _already_logged(self, run_id: str) -> set[tuple[str, int]]:
        run = self.client.get_run(run_id)
        logged = set()
        for key in run.data.metrics:
            for m in self.client.get_metric_history(run_id, key):
                logged.add((key, m.step))
        return logged

    # -- records -------------------------------------------------------------------------------
    def write(self, record: LogRecord) -> None:
        from mlflow.entities import Metric

        if self.run_id is None and not self._warned:
            # once, on the main thread: the run must exist before the first checkpoint records
            # its id, or a resume would start a second run
            try:
                self._ensure_run()
            except Exception as e:
                logger.warning("MLflow at %s is unreachable (%s); training goes on and metrics "
                               "are buffered", self.uri, str(e).splitlines()[0][:160])
                self._warned = True

        now = int(time.time() * 1000)
        metrics = [Metric(f"{record.mode}/{k}", float(v), now, record.step)
                   for k, v in record.scalars.items()]
        with self._lock:
            for m in metrics:
                if len(self._buffer) >= self.max_buffer:
                    self._buffer.popleft()
                    self.dropped += 1
                self._buffer.append(m)
            if len(self._buffer) >= 1000:
                self._lock.notify_all()

    def _sender(self) -> None:
        """Background thread: every ``flush_interval`` (or at 1,000 buffered metrics, or when a
        flush is asked for) send the buffer in batches; retry while the server is down."""
        backoff = 0.5
        while True:
            with self._lock:
                if not self._buffer and self._stop:
                    return
                if len(self._buffer) < 1000 and not self._stop and not self._flush_wanted:
                    self._lock.wait(self.flush_interval)
                if not self._buffer:
                    self._flush_wanted = False
                    continue
                batch = [self._buffer.popleft() for _ in range(min(1000, len(self._buffer)))]
                self._inflight = len(batch)
            try:
                run_id = self._ensure_run()
                batch = [m for m in batch if (m.key, m.step) not in self._logged]
                if batch:
                    self.client.log_batch(run_id, metrics=batch)
                if self._warned:
                    logger.warning("MLflow at %s answers again: buffered metrics sent", self.uri)
                    self._warned = False
                backoff = 0.5
                with self._lock:
                    self._inflight = 0
                    self._lock.notify_all()
            except Exception as e:  # unreachable server, 5xx ...: keep the metrics, retry
                with self._lock:
                    for m in reversed(batch):
                        if len(self._buffer) < self.max_buffer:
                            self._buffer.appendleft(m)
                        else:
                            self.dropped += 1
                    self._inflight = 0
                    self._lock.notify_all()
                if not self._warned:
                    logger.warning("MLflow at %s is unreachable (%s); training goes on and "
                                   "metrics are buffered (up to %d)", self.uri,
                                   str(e).splitlines()[0][:160], self.max_buffer)
                    self._warned = True
                if self._stop and time.monotonic() > self._deadline:
                    return
                time.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def flush(self) -> None:
        """Before a checkpoint: wait (a few seconds at most) until the buffer is sent, so a
        resumed run finds every step up to its checkpoint in MLflow — unless the server is known
        to be down, when waiting would only stall training."""
        if not self._warned:
            self.wait_sent(5.0)

    def wait_sent(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything buffered is sent (True) or ``timeout`` passes (False)."""
        end = time.monotonic() + (timeout if timeout is not None else 1e9)
        with self._lock:
            self._flush_wanted = True
            self._lock.notify_all()
            while self._buffer or self._inflight:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.5))
        return True

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        """Upload a file (a checkpoint) to the run."""
        self.client.log_artifact(self._ensure_run(), str(path), artifact_path)

    def close(self) -> None:
        if self._thread is None:
            return
        sent = self.wait_sent(self.close_timeout)
        self._deadline = time.monotonic()
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        self._thread.join(timeout=5)
        self._thread = None
        if not sent:
            logger.warning("MLflow: %d metrics could not be sent before the run ended",
                           len(self._buffer))
        if self.dropped:
            logger.warning("MLflow: %d metrics were dropped (buffer of %d full while the server "
                           "was unreachable)", self.dropped, self.max_buffer)
        if self.run_id is not None and sent:
            try:
                self.client.set_terminated(self.run_id, "FINISHED")
            except Exception as e:
                logger.warning("MLflow: could not mark run %s finished (%s)", self.run_id, e)
