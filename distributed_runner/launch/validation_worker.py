"""The validating side of asynchronous validation: a Runner built from the training run's config
with ``load_from=<the checkpoint>``, running its own validation loop and hooks (an entry point:
it builds a Runner).

The same function serves both places a validation runs:

* ``python -m distributed_runner.launch.validation_worker CONFIG.pkl`` — the background process of a
  run without Ray (:class:`~distributed_runner.validation.backends.ProcessBackend`): one job per
  stdin line, each result written to the file the job names;
* :func:`ray_validate` — the function of Ray Train's ``ValidationConfig`` (:func:`trainer_kwargs`,
  used by the launcher), run as a Ray task on the reported checkpoint.

The validating Runner (one per process, reused) gets the config without its training keys
(nothing trains there; the hooks that act on validation results in training — save_best, early
stopping — see no training loop and leave them to the training process, which applies the
results), with ``val_cfg`` inline, its own
``work_dir`` (``work_dir/async_val``) and no log sinks: rank 0 of training writes the results
into the run's sinks, one writer for MLflow, TensorBoard and the JSON lines.
"""

from __future__ import annotations

import functools
import json
import pickle
import sys
import time
from pathlib import Path
from typing import Any

from distributed_runner.checkpoint.resume_choice import file_of_reported
from distributed_runner.core.log import redact_process_output
from distributed_runner.core.run_folders import FLAT, run_dir
from distributed_runner.validation.async_validation import KEYS, ValMode

TRAINING_KEYS = (
    "train_dataloader",
    "train_cfg",
    "optim_wrapper",
    "param_scheduler",
    "test_dataloader",
    "test_evaluator",
    "test_cfg",
    "resume",
    "launcher",
)


def validation_config(cfg: dict) -> dict:
    """The config the validating Runner is built from (module docstring)."""
    out = {k: v for k, v in cfg.items() if k not in TRAINING_KEYS}
    out["val_cfg"] = {k: v for k, v in (cfg.get("val_cfg") or {}).items() if k not in KEYS}
    out["load_from"] = None  # each checkpoint is loaded when its validation starts
    # inside the training run's folder, as a folder of its own (not a new run)
    out["work_dir"] = str(run_dir(cfg["work_dir"], cfg.get("run_name")) / "async_val")
    out["run_name"] = FLAT
    hooks = dict(out.get("default_hooks") or {})
    logger = hooks.get("logger")
    hooks["logger"] = {**(logger if isinstance(logger, dict) else {}), "sinks": []}
    if "type" not in hooks["logger"]:
        hooks["logger"]["type"] = "LoggerHook"
    out["default_hooks"] = hooks
    return out


# the validating Runner of each run's config, built once per process (the background process and
# Ray's validation worker both run many validations): its hooks keep their state from one
# validation to the next, as in-loop, and the model, data and hooks are not built again each time
_RUNNERS: dict[str, Any] = {}


def validation_runner(cfg: dict) -> Any:
    from distributed_runner.engine.runner import Runner

    key = str(run_dir(cfg["work_dir"], cfg.get("run_name")))
    if key not in _RUNNERS:
        _RUNNERS[key] = Runner.from_cfg(validation_config(cfg))
    return _RUNNERS[key]


def validate_checkpoint(cfg: dict, checkpoint: str | Path) -> dict:
    """``{'metrics': {...}, 'seconds': s}``: the validation loop's metrics on ``checkpoint`` —
    ``Runner.val()`` with ``load_from=checkpoint``, on a Runner kept for the next one."""
    runner = validation_runner(cfg)
    start = time.perf_counter()
    with runner.sinks.opened(runner), runner.hook_bracket("before_run", "after_run"):
        runner.load_checkpoint(checkpoint)  # load_from's path: after_load_checkpoint, weights
        metrics = runner.val_loop.run()
    return {
        "metrics": {k: float(v) for k, v in metrics.items()},
        "seconds": time.perf_counter() - start,
    }


def serve(cfg: dict, jobs: Any) -> None:
    """Build the validating Runner while training's first interval runs, then validate each job
    (a JSON line) in turn; its result goes to ``job['result']``."""
    try:
        validation_runner(cfg)
    except Exception as e:  # noqa: BLE001 - each job reports it below
        print(f"building the validation Runner failed: {type(e).__name__}: {e}", flush=True)
    for line in jobs:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            result = validate_checkpoint(cfg, job["path"])
        except Exception as e:  # noqa: BLE001 - reported to training, which skips the result
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            result = {"error": f"{type(e).__name__}: {first}"}
            print(f"validation of {job['path']} failed: {result['error']}", flush=True)
        target = Path(job["result"])
        partial = target.with_suffix(".partial")
        partial.write_text(json.dumps(result))
        partial.replace(target)


def ray_validate(checkpoint: Any, *, cfg: dict, **position: Any) -> dict:
    """Ray Train's validation function: the reported checkpoint's metrics, keyed
    ``async_val/<name>`` (Ray merges them into the checkpoint's own metrics)."""
    redact_process_output()
    with checkpoint.as_directory() as folder:
        result = validate_checkpoint(cfg, file_of_reported(folder, checkpoint.path))
    out = {f"async_val/{k}": v for k, v in result["metrics"].items()}
    out["async_val/seconds"] = result["seconds"]
    return out


def trainer_kwargs(plain: dict, mode: ValMode) -> dict:
    """The TorchTrainer's ``validation_config`` for an async run (``mode``: val_cfg's, parsed
    once on the driver), else nothing."""
    if not mode.is_async or plain.get("val_dataloader") is None:
        return {}
    from ray.train import ValidationConfig

    return {
        "validation_config": ValidationConfig(
            fn=functools.partial(ray_validate, cfg=plain),
            ray_remote_kwargs={
                "num_cpus": mode.resources["CPU"],
                "num_gpus": mode.resources["GPU"],
                "max_retries": 0,
            },
        )
    }


if __name__ == "__main__":
    redact_process_output()
    serve(pickle.loads(Path(sys.argv[1]).read_bytes()), sys.stdin)
