"""A trial's config: the sweep's base config, the trial's values, and what makes it a trial.

Everything a trial is differs from an ordinary run only through its config, so a trial runs the
same in the trial's process and on Ray Train workers:

* the sampled values set at their dotted keys (as ``--cfg-options``);
* ``work_dir = <sweep work_dir>/trials/<trial_id>``: an ordinary run's folder, the trial's own
  (``run_name='.'``: no run folder inside it);
* a checkpoint at every validation (CheckpointHook's ``interval`` = ``val_interval``,
  synchronous), so the checkpoint Tune keeps for a result is the run's state at that result;
* MLflow sinks log into the sweep's tracking URI and experiment, in a run named after the trial
  and nested under the sweep's parent run (``mlflow.parentRunId``);
* a resume (``resume=<file>``): the trial's own checkpoint, or — a PBT exploit — the donor's,
  with :class:`hooks.tune_fork_hook.TuneForkHook` applying this trial's values after it and the
  MLflow sink pinned to the trial's own run.
"""

from __future__ import annotations

import copy
from typing import Any

from distributed_runner.checkpoint.hf.directory import pretrained_source
from distributed_runner.checkpoint.resume_choice import parse_load_from
from distributed_runner.core.config import set_dotted, to_plain
from distributed_runner.core.run_folders import FLAT

MLFLOW_SINKS = ("mlflow", "MLflowSink")


def _checkpoint_every_validation(cfg: dict) -> None:
    train_cfg = cfg.get("train_cfg") or {}
    by_epoch = bool(train_cfg.get("by_epoch", "max_iters" not in train_cfg))
    hooks = cfg.setdefault("default_hooks", {}) or {}
    cfg["default_hooks"] = hooks
    spec = hooks.get("checkpoint")
    spec = dict(spec) if isinstance(spec, dict) else {"type": "CheckpointHook"}
    spec.update(interval=int(train_cfg.get("val_interval", 1) or 1), by_epoch=by_epoch)
    spec["async_save"] = False  # the file must be complete when the result is reported
    spec.pop("save_begin", None)
    hooks["checkpoint"] = spec


def _nest_mlflow(cfg: dict, mlflow: dict[str, Any], trial_id: str, run_id: str | None) -> None:
    """Point every MLflow sink of the logger at the sweep's store and parent run."""
    logger = (cfg.get("default_hooks") or {}).get("logger")
    if not isinstance(logger, dict):
        return
    sinks = logger.get("sinks")
    if sinks is None:
        return
    out = []
    for sink in [sinks] if isinstance(sinks, (str, dict)) else list(sinks):
        spec: dict[str, Any] = {"type": sink} if isinstance(sink, str) else dict(sink)
        if spec.get("type") in MLFLOW_SINKS:
            tags = dict(spec.get("tags") or {})
            tags.update({"tune.trial_id": trial_id, "tune.sweep": mlflow["sweep"]})
            if mlflow.get("parent_run_id"):
                tags["mlflow.parentRunId"] = mlflow["parent_run_id"]
            spec.update(
                tracking_uri=mlflow["tracking_uri"],
                experiment=mlflow["experiment"],
                run_name=f"{mlflow['sweep']}-{trial_id}",
                tags=tags,
            )
            if run_id:
                spec["run_id"] = run_id
        out.append(spec)
    logger["sinks"] = out


def trial_config(
    base: dict,
    values: dict[str, Any],
    trial_id: str,
    work_dir: str,
    mlflow: dict[str, Any] | None = None,
    resume: str | None = None,
    fork: dict[str, Any] | None = None,
    mlflow_run_id: str | None = None,
) -> dict:
    """The plain config of trial ``trial_id`` (see the module docstring).

    ``fork``: ``dict(donor=<trial id>, iteration=N, changes={key: [donor's, own]})`` when
    ``resume`` is another trial's checkpoint; ``mlflow_run_id`` the trial's own run then.
    """
    cfg = copy.deepcopy(to_plain(base))
    cfg.pop("tune", None)
    for dotted, value in values.items():
        set_dotted(cfg, dotted, value)
    cfg = to_plain(cfg)
    cfg["work_dir"] = work_dir
    cfg["run_name"] = FLAT  # the trial's folder is its run's
    _checkpoint_every_validation(cfg)
    if mlflow is not None:
        _nest_mlflow(cfg, mlflow, trial_id, mlflow_run_id if fork else None)
    if resume is not None:
        cfg["resume"] = resume
        given, _ = parse_load_from(cfg.get("load_from"))
        if not pretrained_source(given):  # a model directory stays: it builds the model, and
            cfg.pop("load_from", None)  # a checkpoint without its frozen base needs it
    else:
        cfg["resume"] = False  # a fresh trial never picks up a stale work_dir
    if fork:
        hooks = list(cfg.get("custom_hooks") or [])
        hooks.append({"type": "TuneForkHook", **fork})
        cfg["custom_hooks"] = hooks
    return cfg


def with_report_hook(cfg: dict, channel: str) -> dict:
    """``cfg`` with the in-process trial's :class:`hooks.tune_report_hook.TuneReportHook`."""
    cfg = dict(cfg)
    cfg["custom_hooks"] = [
        *list(cfg.get("custom_hooks") or []),
        {"type": "TuneReportHook", "channel": channel},
    ]
    return cfg
