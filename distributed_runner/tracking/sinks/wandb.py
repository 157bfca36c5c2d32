"""WandbSink: one Weights & Biases run per training run (the seeds name wandb among LoggerHook's
backends). Optional: ``pip install wandb`` (the project's ``wandb`` extra).

``LoggerHook(sinks=['terminal', dict(type='wandb', project='digits')])``

* **One run across resumes.** The run id is kept in LoggerHook's state (so in every checkpoint)
  and in ``work_dir/wandb_run.json``; a resumed run (``--resume``, a Ray restart) logs into the
  same W&B run (``wandb.init(id=..., resume='allow')``). Only rank 0 talks to W&B.
* **Steps.** W&B's own step only grows, so records are logged without it and each mode charts
  against its own step metric: ``train/*`` against ``train/step`` (completed iterations),
  ``val/*`` against ``val/step`` — the epoch with LoggerHook's ``log_metric_by_epoch=True``
  (MMEngine's default) in an epoch-based run, else the iteration — and ``test/*`` likewise. A
  resumed run that logs a step again logs the same value (an exact resume recomputes it).
* ``project``, ``entity``, ``name``, ``group``, ``tags``, ``mode`` (``'online'``, ``'offline'``,
  ``'disabled'``; default: W&B's, so ``WANDB_MODE`` works), and ``init_kwargs`` (anything else
  ``wandb.init`` takes, MMEngine's WandbVisBackend argument). ``dir`` defaults to ``work_dir``.
  The (redacted) config is the run's config. The run ends with exit code 0 when training
  finished, 1 when it failed or was preempted.
* **Failure.** If ``wandb.init`` fails (online without ``wandb login`` / ``WANDB_API_KEY``, the
  server unreachable), LoggerHook warns once and training goes on without this sink; it is not
  retried at every record. On an interactive terminal without a login, wandb itself asks for
  one: use ``mode='offline'`` or log in first.
* **Cost.** The run starts at the first record (its id may come from the checkpoint the run
  resumes, which is loaded after the sinks open): ``wandb.init`` takes 1-3 s here, once, inside
  that step. After it, ``log`` hands the values to W&B's own background process.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.core.config import to_plain
from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.redact import redact
from distributed_runner.core.registry import LOG_SINKS
from distributed_runner.core.run_folders import run_label
from distributed_runner.tracking.sinks.base import LogRecord, LogSink

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI

RUN_FILE = "wandb_run.json"


@LOG_SINKS.register_module()
class WandbSink(LogSink):
    """See the module docstring."""

    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: Sequence[str] | None = None,
        mode: str | None = None,
        dir: str | None = None,
        init_kwargs: dict | None = None,
    ) -> None:
        try:  # checked here: a config naming it fails when the Runner is built, not mid-run
            importlib.import_module("wandb")
        except ImportError as e:
            raise ArgumentError(
                "",
                "the wandb sink needs the wandb package: pip install wandb "
                "(or the project's extra: pip install -e '.[wandb]')",
            ) from e
        if mode not in (None, "online", "offline", "disabled"):
            raise ArgumentError("mode", f"{mode!r}: use 'online', 'offline' or 'disabled'")
        self.settings = {
            "project": project,
            "entity": entity,
            "name": name,
            "group": group,
            "tags": list(tags) if tags else None,
            "mode": mode,
            "dir": dir,
        }
        self.init_kwargs = dict(init_kwargs or {})
        clash = sorted(set(self.init_kwargs) & (set(self.settings) | {"id", "resume", "config"}))
        if clash:
            raise ArgumentError(
                f"init_kwargs.{clash[0]}",
                "set by the sink (or its own argument of that name): remove it",
            )
        self.run_id: str | None = None  # restored from a checkpoint through LoggerHook
        self._run: Any = None
        self._outcome = "FINISHED"
        self._modes: set[str] = set()

    def state_dict(self) -> dict:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict) -> None:
        self.run_id = state.get("run_id") or self.run_id

    def open(self, runner: RunnerAPI) -> None:
        self.work_dir = Path(runner.work_dir)
        self._outcome, self._modes = "FINISHED", set()
        self._start_error: str | None = None
        self._runner_name = run_label(runner.experiment_name, runner.run_name, runner.timestamp)
        self._config = redact(to_plain(runner.cfg))
        self._experiment = runner.experiment_name

    def _start(self) -> None:
        """Start (or resume) the run at the first record: a run that never logs opens none."""
        import wandb

        settings: dict[str, Any] = {k: v for k, v in self.settings.items() if v is not None}
        settings.setdefault("dir", str(self.work_dir))
        settings.setdefault("project", self._experiment)
        settings.setdefault("name", self._runner_name)
        Path(settings["dir"]).mkdir(parents=True, exist_ok=True)
        resume: dict[str, Any] = {"id": self.run_id, "resume": "allow"} if self.run_id else {}
        self._run = wandb.init(config=self._config, **settings, **resume, **self.init_kwargs)
        if self.run_id != self._run.id:
            self.run_id = self._run.id
            (self.work_dir / RUN_FILE).write_text(
                json.dumps(
                    {
                        "run_id": self.run_id,
                        "project": settings["project"],
                        "mode": self.settings["mode"] or "default",
                    }
                )
            )

    def write(self, record: LogRecord) -> None:
        if self._run is None:
            if self._start_error is not None:  # one wandb.init a run (it may wait 90 s)
                raise RuntimeError(self._start_error)
            try:
                self._start()
            except Exception as e:
                self._start_error = f"wandb.init failed: {type(e).__name__}: {e}"
                raise
        mode = record.mode
        if mode not in self._modes:
            self._modes.add(mode)
            self._run.define_metric(f"{mode}/step", hidden=True)
            self._run.define_metric(f"{mode}/*", step_metric=f"{mode}/step")
        values = {f"{mode}/{k}": v for k, v in record.scalars.items()}
        values[f"{mode}/step"] = record.chart_step
        self._run.log(values)

    def finish(self, outcome: str) -> None:
        self._outcome = outcome

    def close(self) -> None:
        if self._run is not None:
            self._run.finish(exit_code=0 if self._outcome == "FINISHED" else 1)
            self._run = None
