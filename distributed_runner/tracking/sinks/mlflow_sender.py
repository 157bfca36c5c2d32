"""The MLflow sender: a separate process that owns the MlflowClient and the metric buffer.

Why a process and not a thread: MLflow's client (and its SQLite store) spend their time in
Python; a sender thread would take the GIL away from the training loop for a large part of every
second when metrics are logged each iteration. In its own process it runs on another core and the
step only pays for putting a small tuple on a queue.

Protocol (all through two multiprocessing queues): the sink puts ``("m", [(key, value,
timestamp_ms, step), ...])`` for metrics and ``(request_id, command, args)`` for requests; the
sender answers requests with ``(request_id, ok, result)`` on the reply queue. Commands:
``ensure_run`` (create the run, or adopt a restored one and learn which steps it has), ``flush``,
``artifact``, ``close`` (send what is left, end the run with the outcome it is given).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import re
import sys
import time
from collections import deque
from typing import Any

from distributed_runner.core.redact import redact_text, redact_url

_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")
BATCH = 1000


class _Sender:
    """The MlflowClient, the run and the bounded metric buffer, all owned by the sender process
    (so the training process never waits on MLflow)."""

    def __init__(self, uri: str, settings: dict) -> None:
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=uri)
        self.uri = redact_url(uri)  # for messages only
        self.settings = settings
        self.buffer: deque = deque()
        self.max_buffer = settings["max_buffer"]
        self.dropped = 0
        self.down = False
        self.run_id: str | None = None
        self.experiment_id: str | None = None  # known once the run is open (for its link)
        self.failed_open: tuple | None = None  # an ensure_run that failed: retried before sending
        self.logged: set[tuple[str, int]] = set()
        self.log = logging.getLogger("distributed_runner.mlflow")

    # -- requests ----------------------------------------------------------------------------
    def ensure_run(self, run_id: str | None, info: dict) -> str:
        if self.run_id is not None:
            return self.run_id
        if run_id is not None:
            run = self.client.get_run(run_id)
            for key in run.data.metrics:
                for m in self.client.get_metric_history(run_id, key):
                    self.logged.add((key, m.step))
            self.client.update_run(run_id, status="RUNNING")
            self.run_id, self.experiment_id = run_id, run.info.experiment_id
            return run_id
        experiment = self.client.get_experiment_by_name(info["experiment"])
        experiment_id = (
            experiment.experiment_id
            if experiment
            else self.client.create_experiment(info["experiment"])
        )
        tags = {k: redact_text(str(v)) for k, v in (info["tags"] or {}).items()}
        run = self.client.create_run(experiment_id, run_name=info["run_name"], tags=tags)
        self.run_id, self.experiment_id = run.info.run_id, experiment_id
        if info["params"] is not None:
            from mlflow.entities import Param

            params = [
                Param(_KEY_CHARS.sub("_", k)[:250], redact_text(str(v))[:6000])
                for k, v in info["params"].items()
            ]
            for i in range(0, len(params), 100):
                self.client.log_batch(self.run_id, params=params[i : i + 100])
        return self.run_id

    # -- metrics -----------------------------------------------------------------------------
    def add(self, metrics: list) -> None:
        for m in metrics:
            if len(self.buffer) >= self.max_buffer:
                self.buffer.popleft()
                self.dropped += 1
            self.buffer.append(m)

    def send_some(self) -> bool:
        """Send up to one batch; False (and the batch kept) when the server does not answer."""
        from mlflow.entities import Metric

        if not self.buffer or self.run_id is None:
            return self.run_id is not None or not self.buffer
        batch = [self.buffer.popleft() for _ in range(min(BATCH, len(self.buffer)))]
        todo = [Metric(k, v, ts, step) for k, v, ts, step in batch if (k, step) not in self.logged]
        try:
            if todo:
                self.client.log_batch(self.run_id, metrics=todo)
        # any exception: whatever the client raises (HTTP, connection, MLflow errors), training
        # goes on and the batch waits in the buffer; the warning names the error
        except Exception as e:  # noqa: BLE001
            self.buffer.extendleft(reversed(batch))
            while len(self.buffer) > self.max_buffer:
                self.buffer.pop()
                self.dropped += 1
            if not self.down:
                self.log.warning(
                    "MLflow at %s is unreachable (%s); training goes on and "
                    "metrics are buffered (up to %d)",
                    self.uri,
                    str(e).splitlines()[0][:160],
                    self.max_buffer,
                )
                self.down = True
            return False
        if self.down:
            self.log.warning("MLflow at %s answers again: buffered metrics sent", self.uri)
            self.down = False
        return True

    def retry_pending(self) -> None:
        """Open the run the sink asked for while the server was down, once it answers."""
        if self.run_id is None and self.failed_open is not None:
            try:
                self.ensure_run(*self.failed_open)
                self.failed_open = None
            except Exception:  # noqa: BLE001 - still down (warned once): the next flush retries
                pass

    def drain(self, deadline: float) -> bool:
        """Send everything (retrying) until ``deadline``; True if the buffer is empty."""
        backoff = 0.5
        while self.buffer and time.monotonic() < deadline:
            self.retry_pending()
            if self.run_id is None or not self.send_some():
                time.sleep(min(backoff, max(deadline - time.monotonic(), 0)))
                backoff = min(backoff * 2, 5.0)
        return not self.buffer

    def send_due(self) -> bool:
        """The periodic send: open a pending run, then send batches while full ones are waiting;
        False when the server did not answer (the caller backs off)."""
        self.retry_pending()
        ok = True
        while ok and self.buffer and self.run_id is not None:
            ok = self.send_some()
            if len(self.buffer) < BATCH:
                break
        return ok

    # -- commands (answered on the reply queue by _answer) -----------------------------------
    def open_run(self, args: tuple) -> str:
        """``ensure_run``; when the server does not answer, the request is kept and retried
        before each send while metrics go on buffering."""
        try:
            return self.ensure_run(*args)
        except Exception:
            self.failed_open = args
            raise

    def flush(self, wait: float) -> str | None:
        """Send what is buffered within ``wait`` seconds; returns the run id (None: not open)."""
        # a server known to be down gets one try, not the whole wait: a checkpoint must not stall
        # training during an outage
        self.drain(time.monotonic() + (0.0 if self.down else wait))
        if self.down:
            self.retry_pending()
            if self.run_id is not None:
                self.send_some()
        return self.run_id

    def artifact(self, path: str, *rest: Any) -> None:
        """Log a file, or a folder (a checkpoint's shards), to the run."""
        if self.run_id is None:
            raise RuntimeError(
                "no MLflow run to log to: the server did not answer when the run was to start"
            )
        log = self.client.log_artifacts if os.path.isdir(path) else self.client.log_artifact
        log(self.run_id, path, *rest)

    def close(self, timeout: float, outcome: str) -> dict:
        """Send what is left within ``timeout``, end the run with ``outcome``; what was sent."""
        sent = self.drain(time.monotonic() + timeout)
        if self.run_id is None:
            sent = False
        # a run whose metrics could not all be sent is not marked FINISHED: it stays RUNNING, and
        # a resume adopts it and sends the rest
        if self.run_id is not None and (sent or outcome != "FINISHED"):
            self.client.set_terminated(self.run_id, outcome)
        return {
            "sent": sent,
            "unsent": len(self.buffer),
            "dropped": self.dropped,
            "run_id": self.run_id,
            "experiment_id": None if self.down else self.experiment_id,
        }


def _run_command(sender: _Sender, command: str, args: Any) -> Any:
    """The result of one request other than ``close`` (which ends the sender: see _answer)."""
    if command == "ensure_run":
        return sender.open_run(args)
    if command == "flush":
        return sender.flush(args[0])
    if command == "artifact":
        sender.artifact(*args)
        return None
    raise ValueError(f"unknown command {command!r}")


def _answer(sender: _Sender, message: tuple, outbox: Any) -> bool:
    """Answer one request on ``outbox`` (a failure is answered too, as one line); True when it
    was a ``close`` that succeeded: the sender process then ends."""
    request_id, command, args = message
    try:
        if command == "close":
            timeout, outcome = args
            outbox.put((request_id, True, sender.close(timeout, outcome)))
            return True
        outbox.put((request_id, True, _run_command(sender, command, args)))
    except Exception as e:  # noqa: BLE001 - any failure is answered to the caller, which raises
        outbox.put(
            (
                request_id,
                False,
                f"{type(e).__name__}: {str(e).splitlines()[0]}" if str(e) else type(e).__name__,
            )
        )
    return False


def _setup_process() -> None:
    """MLflow's environment and the logging of the sender process: a spawned process starts
    without the trainer's logging, and its warnings (server down, back again) must still show."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # we retry, not mlflow
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    # MLflow's own "View run ... at" line repeats the tracking URI, password included: the sink
    # logs the link itself, redacted
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%m/%d %H:%M:%S",
    )


def sender_main(uri: str, settings: dict, inbox: Any, outbox: Any) -> None:
    """Entry point of the sender process: metrics are buffered and sent every
    ``flush_interval`` seconds (at once when a full batch waits), requests answered in order."""
    _setup_process()
    sender = _Sender(uri, settings)
    interval = settings["flush_interval"]
    next_send = time.monotonic() + interval
    backoff = 0.5
    parent = multiprocessing.parent_process()
    while True:
        try:
            message = inbox.get(timeout=max(next_send - time.monotonic(), 0.0))
        except queue.Empty:
            message = None
            if parent is not None and not parent.is_alive():
                # the training process died (a Ray worker killed, a crash without close): send
                # what it handed over, leave the run RUNNING for a resume (or the Ray driver,
                # which marks it FAILED when Ray gives up), and do not outlive it
                sender.drain(time.monotonic() + 10.0)
                return
        if message is not None and message[0] == "m":
            sender.add(message[1])
            if len(sender.buffer) < BATCH:
                continue
        elif message is not None:
            if _answer(sender, message, outbox):
                return
            continue
        if time.monotonic() >= next_send or len(sender.buffer) >= BATCH:
            ok = sender.send_due()
            backoff = 0.5 if ok else min(backoff * 2, 5.0)
            next_send = time.monotonic() + (interval if ok else backoff)
