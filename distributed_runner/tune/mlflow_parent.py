"""The sweep's MLflow parent run: each trial's own run (the project's MLflowSink, configured by
:mod:`.trial_config`) is nested under it with ``mlflow.parentRunId``.

Not Ray's ``MLflowLoggerCallback``: it makes one flat run per trial from Tune's result rows,
beside the run the trial's sink already keeps. The parent's id is kept in
``work_dir/mlflow_sweep.json``, so ``drun tune --resume`` continues the same parent. At the end
the parent gets the best values (params ``best.<key>``), the best metric and the results table;
each child gets ``tune.status``, ``tune.stopped_early`` and, for a PBT trial, its forks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from distributed_runner.tracking.sinks.mlflow import MLFLOW_SINK_TYPES, tracking_uri

SWEEP_FILE = "mlflow_sweep.json"


def mlflow_settings(cfg: dict, work_dir: Path, sweep: str) -> dict[str, Any] | None:
    """Where trials log (tracking URI, experiment), if the logger has an MLflow sink."""
    logger = (cfg.get("default_hooks") or {}).get("logger")
    sinks = logger.get("sinks", []) if isinstance(logger, dict) else []
    for sink in [sinks] if isinstance(sinks, (str, dict)) else list(sinks or []):
        spec = {"type": sink} if isinstance(sink, str) else sink
        if isinstance(spec, dict) and spec.get("type") in MLFLOW_SINK_TYPES:
            return {
                "tracking_uri": tracking_uri(spec.get("tracking_uri"), work_dir),
                "experiment": spec.get("experiment")
                or os.environ.get("MLFLOW_EXPERIMENT_NAME")
                or work_dir.name,
                "sweep": sweep,
            }
    return None


def _client(uri: str) -> Any:
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def open_parent(settings: dict[str, Any], work_dir: Path, tags: dict[str, str]) -> str:
    """The parent run's id: the one ``work_dir`` names (a resumed sweep, back to RUNNING), else a
    new run."""
    client = _client(settings["tracking_uri"])
    known = work_dir / SWEEP_FILE
    if known.is_file():
        run_id = json.loads(known.read_text())["run_id"]
        client.update_run(run_id, status="RUNNING")
        return run_id
    experiment = client.get_experiment_by_name(settings["experiment"])
    experiment_id = (
        experiment.experiment_id if experiment else client.create_experiment(settings["experiment"])
    )
    run = client.create_run(
        experiment_id, run_name=f"{settings['sweep']}-sweep", tags={"drun.kind": "sweep", **tags}
    )
    known.write_text(json.dumps({"run_id": run.info.run_id, "experiment": settings["experiment"]}))
    return run.info.run_id


def close_parent(
    settings: dict[str, Any],
    run_id: str,
    rows: list[dict[str, Any]],
    keys: list[str],
    metric: str,
    status: str,
    results_file: Path | None,
) -> None:
    """Best values and metric on the parent, status tags on the children, the parent ended."""
    client = _client(settings["tracking_uri"])
    if rows and rows[0].get(f"best_{metric}") is not None:
        best = rows[0]
        client.log_metric(run_id, f"best/{metric}", float(best[f"best_{metric}"]))
        client.set_tag(run_id, "best.trial_id", best["trial_id"])
        for key in keys:
            client.set_tag(run_id, f"best.{key}", str(best.get(key)))
    if results_file is not None and results_file.is_file():
        client.log_artifact(run_id, str(results_file))
    for row in rows:
        child = Path(row["work_dir"]) / "mlflow_run.json"
        if not child.is_file():
            continue
        child_id = json.loads(child.read_text())["run_id"]
        client.set_tag(child_id, "tune.status", row["status"])
        client.set_tag(child_id, "tune.stopped_early", str(bool(row["stopped_early"])).lower())
        forks = Path(row["work_dir"]) / "tune_forks.jsonl"
        if forks.is_file():
            for i, line in enumerate(forks.read_text().splitlines()):
                fork = json.loads(line)
                client.set_tag(
                    child_id,
                    f"tune.fork.{i}",
                    f"from trial {fork['donor']} at iteration {fork['iteration']}: "
                    + ", ".join(f"{k} {a}->{b}" for k, (a, b) in fork["changes"].items()),
                )
    client.set_terminated(run_id, status)
