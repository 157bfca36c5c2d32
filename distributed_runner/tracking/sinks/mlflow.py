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
* **Never stalls the first step either.** The run is opened by the sender while training goes on
  (the sender imports MLflow and creates the run); the sink learns the run id at the next flush,
  which comes before any checkpoint records it.
* **Tells the truth about the end.** The run ends ``FINISHED``, ``FAILED`` when training raised,
  ``KILLED`` when it was preempted after its checkpoint; a resumed run goes back to ``RUNNING``.
* **What a run holds.** Params: the flattened config with secret-looking values redacted. Tags:
  world size, launcher, Ray run name and job id, git commit of the config's checkout (computed on
  the Ray driver, so workers tag it too).
* ``tracking_uri``: the config value, else ``MLFLOW_TRACKING_URI`` (the Ray driver forwards its
  ``MLFLOW_*`` variables to the workers), else a SQLite store in the config's
  ``work_dir/mlflow.db`` (beside the run folders, shared by them). ``experiment``: the config
  value, else ``MLFLOW_EXPERIMENT_NAME``, else the run's ``experiment_name``. ``run_name``:
  default the experiment and the run's folder, e.g. ``digits_cnn-20261122_181500``
  (:func:`~distributed_runner.core.run_folders.run_label`), so the MLflow run and the folder
  name each other.
* ``tags``: more tags for the run (``drun tune`` nests a trial's run under its sweep's with
  ``mlflow.parentRunId``). ``run_id``: log into this existing run whatever a checkpoint says —
  a PBT trial resumed from another trial's checkpoint keeps its own run.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import multiprocessing
import os
import queue
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.core.config import to_plain
from distributed_runner.core.log import LOGGER_NAME
from distributed_runner.core.redact import flatten, redact, redact_url
from distributed_runner.core.registry import LOG_SINKS
from distributed_runner.core.run_folders import run_label, runs_root
from distributed_runner.tracking.sinks.base import LogRecord, LogSink
from distributed_runner.tracking.sinks.mlflow_sender import sender_main

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI

logger = logging.getLogger(LOGGER_NAME)
RUN_FILE = "mlflow_run.json"
MLFLOW_SINK_TYPES = ("mlflow", "MLflowSink")  # how a config names this sink


def tracking_uri(configured: str | None, work_dir: Path) -> str:
    """Where the sink logs (see the module docstring)."""
    return (
        configured
        or os.environ.get("MLFLOW_TRACKING_URI")
        or f"sqlite:///{Path(work_dir) / 'mlflow.db'}"
    )


def _ray_job_id() -> str | None:
    """The Ray job this process belongs to (``ray job submit``), if any."""
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - the job id only labels the run: no Ray, no label
        return None
    return None


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start the sender without re-running the user's script in it.

    A spawned child imports the parent's ``__main__`` (by path or module name) before it runs its
    target. A script without an ``if __name__ == "__main__":`` guard would then train a second
    time inside the sender, and fail to start it. The sender needs nothing from ``__main__``
    (its target and arguments are ours and plain), so while it starts, ``__main__`` is an empty
    module: the child has nothing to import. Notebooks have no main file and are unaffected.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


@LOG_SINKS.register_module()
class MLflowSink(LogSink):
    """See the module docstring."""

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str | None = None,
        run_name: str | None = None,
        max_buffer: int = 100_000,
        flush_interval: float = 2.0,
        close_timeout: float = 60.0,
        log_params: bool = True,
        tags: dict[str, str] | None = None,
        run_id: str | None = None,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.run_name = run_name
        self.max_buffer = int(max_buffer)
        self.flush_interval = float(flush_interval)
        self.close_timeout = float(close_timeout)
        self.log_params = log_params
        self.extra_tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.pinned_run_id = run_id  # a checkpoint's run id does not replace it
        self.run_id: str | None = run_id  # else restored from a checkpoint through LoggerHook
        self.dropped = 0
        self._process: Any = None
        self._ids = itertools.count()
        self._pending: list[tuple] = []
        self._handed = 0.0

    # -- lifecycle -----------------------------------------------------------------------------
    def open(self, runner: RunnerAPI) -> None:
        self.work_dir = Path(runner.work_dir)
        self.uri = tracking_uri(self.tracking_uri, runs_root(self.work_dir, runner.run_name))
        self.shown_uri = redact_url(self.uri)  # what logs and files say: no password
        tags = {
            "world_size": str(runner.world_size),
            "launcher": runner.launcher if isinstance(runner.launcher, str) else "ray",
            "experiment_name": runner.experiment_name,
        }
        launcher = runner.cfg.get("launcher") if hasattr(runner.cfg, "get") else None
        ray_name = launcher.get("name") if isinstance(launcher, dict) else None
        if ray_name:
            tags["ray_run_name"] = str(ray_name)
        job_id = _ray_job_id()
        if job_id:
            tags["ray_job_id"] = job_id
        commit = getattr(runner.cfg, "git_commit", None)
        if commit:
            tags["git_commit"] = commit
        tags.update(self.extra_tags)
        experiment = (
            self.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or runner.experiment_name
        )
        run_name = self.run_name or run_label(
            runner.experiment_name, runner.run_name, runner.timestamp
        )
        # plain strings only: the sender is another process, and a config may hold objects
        params = {
            k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
            for k, v in flatten(redact(to_plain(runner.cfg))).items()
        }
        self._run_info = {
            "experiment": experiment,
            "run_name": run_name,
            "tags": tags,
            "params": params if self.log_params else None,
        }
        self._outcome = "FINISHED"
        self._run_opened = False  # each train()/val()/test() has its own sender to tell
        self._opening: int | None = None  # the id of the ensure_run request not yet answered
        self._answers: dict[int, tuple[bool, Any]] = {}
        ctx = multiprocessing.get_context("spawn")
        self._inbox, self._outbox = ctx.Queue(), ctx.Queue()
        settings = {"max_buffer": self.max_buffer, "flush_interval": self.flush_interval}
        self._process = ctx.Process(
            target=sender_main,
            name="mlflow-sender",
            daemon=True,
            args=(self.uri, settings, self._inbox, self._outbox),
        )
        with _main_module_hidden():
            self._process.start()

    def _post(self, command: str, *args: Any) -> int:
        """Send a request to the sender process without waiting; returns its id."""
        self._hand_over()  # metrics first: a flush or close covers everything written so far
        request_id = next(self._ids)
        self._inbox.put((request_id, command, args))
        return request_id

    def _answer(self, request_id: int, timeout: float | None) -> tuple[bool, Any] | None:
        """The sender's answer to ``request_id`` (None if not there within ``timeout``; a
        ``timeout`` of None only looks). Answers to other requests are kept for their askers."""
        end = time.monotonic() + (timeout or 0.0)
        while request_id not in self._answers:
            try:
                if timeout is None:
                    answer_id, ok, result = self._outbox.get_nowait()
                else:
                    answer_id, ok, result = self._outbox.get(timeout=max(end - time.monotonic(), 0))
            except queue.Empty:
                return None
            self._answers[answer_id] = (ok, result)
        return self._answers.pop(request_id)

    def _request(self, command: str, *args: Any, timeout: float = 120.0) -> Any:
        """Ask the sender process and wait; raises RuntimeError with its error, or on no
        answer. The answer to an earlier ``ensure_run`` is taken up on the way."""
        request_id = self._post(command, *args)
        answer = self._answer(request_id, timeout)
        self._take_opening()  # answered before this request: the sender keeps order
        if answer is None:
            raise RuntimeError(f"no answer from the MLflow sender to {command!r}")
        ok, result = answer
        if not ok:
            raise RuntimeError(result)
        return result

    def state_dict(self) -> dict:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict) -> None:
        if self.pinned_run_id is None:
            self.run_id = state.get("run_id") or self.run_id

    def _ensure_run(self) -> None:
        """Once, at the first record, ask the sender to open the run — without waiting for it:
        the run must exist before a checkpoint records its id (or a resume would start a
        second run), and every flush before a checkpoint waits for the sender, which answers in
        order. Restored runs are adopted, new ones created."""
        self._run_opened = True
        self._opening = self._post("ensure_run", self.run_id, self._run_info)

    def _take_opening(self) -> None:
        """Adopt the answer to ``ensure_run`` if it is there, without waiting (or warn that the
        server is down: metrics are buffered and the run opened when it answers)."""
        if self._opening is None:
            return
        answer = self._answer(self._opening, None)
        if answer is None:
            return
        self._opening = None
        ok, result = answer
        if ok:
            self._adopt(result)
        else:
            logger.warning(
                "MLflow at %s is unreachable (%s); training goes on, metrics are "
                "buffered and the run is opened when the server answers",
                self.shown_uri,
                result,
            )

    def _adopt(self, run_id: str | None) -> None:
        """Record the run id the sender reports (in LoggerHook's state and work_dir)."""
        if run_id is None or (run_id == self.run_id and (self.work_dir / RUN_FILE).is_file()):
            return
        self.run_id = run_id
        (self.work_dir / RUN_FILE).write_text(
            json.dumps(
                {
                    "run_id": run_id,
                    "tracking_uri": self.shown_uri,
                    "experiment": self._run_info["experiment"],
                }
            )
        )
        logger.info(
            "MLflow run %s in experiment %r at %s",
            run_id,
            self._run_info["experiment"],
            self.shown_uri,
        )

    # -- records -------------------------------------------------------------------------------
    def write(self, record: LogRecord) -> None:
        if self._process is None:
            return
        if not getattr(self, "_run_opened", False):
            self._ensure_run()
        now = int(record.created * 1000)  # when it happened, not when the queue wrote it
        self._pending.extend(
            (f"{record.mode}/{k}", float(v), now, record.chart_step)
            for k, v in record.scalars.items()
        )
        # hand over in chunks: one queue message per ~second, not one per step
        if len(self._pending) >= 1000 or time.monotonic() - self._handed > 1.0:
            self._hand_over()

    def _hand_over(self) -> None:
        if self._pending:
            self._inbox.put(("m", self._pending))
            self._pending = []
        self._handed = time.monotonic()
        if self._opening is not None:  # once a second: say where the run is as soon as known
            self._take_opening()

    def flush(self) -> None:
        """Before a checkpoint: give the sender a few seconds to send what it holds, so a resumed
        run finds every step up to its checkpoint in MLflow (it never waits longer)."""
        if self._process is not None and getattr(self, "_run_opened", False):
            opening, start = self._opening is not None, time.monotonic()
            try:
                self._adopt(self._request("flush", 5.0, timeout=90))
            except RuntimeError as e:
                logger.warning("MLflow: flush before the checkpoint failed (%s)", e)
            waited = time.monotonic() - start
            if opening and waited > 1.0:  # so that a slow first checkpoint is explained
                logger.info(
                    "MLflow: the checkpoint waited %.1f s for the sender to start and "
                    "open the run (its id goes into the checkpoint); only the first one "
                    "does",
                    waited,
                )

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> bool:
        """Upload a file (a checkpoint, an image) or a folder's files (its shards) to the run,
        waiting for the upload (raises RuntimeError if it failed: a lost checkpoint must not pass
        unnoticed). False while the sink is not open: there is no sender to upload it.

        There is no ``add_image``: MLflow keeps images as files, and the hooks that draw them
        (VisualizationHook) also write the file and hand it over here, so an ``add_image`` would
        upload each image twice."""
        if self._process is None:
            return False
        if not getattr(self, "_run_opened", False):
            self._ensure_run()
        self._request("artifact", str(path), artifact_path, timeout=600)
        return True

    def finish(self, outcome: str) -> None:
        self._outcome = outcome

    def close(self) -> None:
        if self._process is None:
            return
        try:
            summary = self._request(
                "close", self.close_timeout, self._outcome, timeout=self.close_timeout + 60
            )
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
            link = summary.get("experiment_id") and self.shown_uri.startswith(
                ("http://", "https://")
            )
            if link:
                logger.info(
                    "MLflow run %s (%s): %s/#/experiments/%s/runs/%s",
                    summary["run_id"],
                    self._outcome,
                    self.shown_uri.rstrip("/"),
                    summary["experiment_id"],
                    summary["run_id"],
                )
            if summary["unsent"]:
                logger.warning(
                    "MLflow: %d metrics could not be sent before the run ended", summary["unsent"]
                )
            if summary["dropped"]:
                logger.warning(
                    "MLflow: %d metrics were dropped (buffer of %d full while the "
                    "server was unreachable)",
                    summary["dropped"],
                    self.max_buffer,
                )
