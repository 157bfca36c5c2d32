"""Launchers: run a config in this process (``launcher='none'``) or on Ray Train workers.

``launcher=dict(type='ray', num_workers=2, use_gpu=False, resources_per_worker=None,
placement_strategy='PACK', address=None, storage_path=None, name=None, max_failures=0,
elastic_resize_monitor_interval_s=60)``; ``num_workers=(min, max)`` is an elastic group
(:mod:`distributed_runner.elastic`).

On Ray the driver only loads and checks: it validates the config (every ``type`` resolves, every
argument exists) and the resource request against the cluster — a request the cluster cannot meet
is a one-line error within seconds rather than a trainer waiting forever — and then runs a Ray
Train ``TorchTrainer`` whose workers each build the Runner from the plain config dict
(:func:`distributed_runner.ray_worker.train_worker`). The driver never builds the model.

* no ``address`` and no ``RAY_ADDRESS``: a local Ray is started in this process;
  ``address='auto'`` (or ``RAY_ADDRESS``) joins the one running cluster (``ray start --head``) and
  refuses when several run on the machine; the driver prints which cluster it joined, and forwards
  its ``MLFLOW_*`` and ``WANDB_*`` environment to the workers
  (:mod:`distributed_runner.ray_connect`).
* ``storage_path`` defaults to ``work_dir/ray_storage``; multi-node runs point it at shared storage
  (an NFS path or ``s3://``). ``name`` defaults to the work_dir's folder name, so rerunning the same
  config continues the run from its last reported checkpoint instead of starting over. Relative
  paths inside a ``ray job submit`` package folder go under ``$DRUN_WORK_ROOT`` (``~/drun``).
* ``max_failures``: how many times Ray restarts the worker group after a worker dies; each restart
  resumes exactly from the last checkpoint Ray holds.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from . import registry
from .config import Config, to_plain
from .config_prep import prepare_config
from .elastic import check_elastic_config
from .errors import ConfigError, did_you_mean
from .ray_connect import (
    announced_path,
    check_storage,
    forwarded_env,
    probe_address,
    resolve_address,
    start_local_ray,
)
from .redact import redact_url
from .signatures import check_arguments

RAY_DEFAULTS: dict[str, Any] = {
    "type": "ray",
    "num_workers": 1,
    "use_gpu": False,
    "resources_per_worker": None,
    "placement_strategy": "PACK",
    "address": None,
    "storage_path": None,
    "name": None,
    "max_failures": 0,
    "elastic_resize_monitor_interval_s": 60.0,
}
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


def normalize_launcher(spec: Any) -> dict | None:
    """The launcher config with defaults filled in, or None for the single-process path."""
    if spec is None or spec == "none" or (isinstance(spec, dict) and spec.get("type") == "none"):
        return None
    if spec == "ray":
        spec = {"type": "ray"}
    if not isinstance(spec, dict):
        raise ConfigError(
            "launcher", f"expected 'none', 'ray' or dict(type='ray', ...), got {spec!r}"
        )
    if spec.get("type", "ray") != "ray":
        raise ConfigError(
            "launcher.type", f"unknown launcher {spec['type']!r}: use 'none' or 'ray'"
        )
    options = ", ".join(k for k in RAY_DEFAULTS if k != "type")
    for key in spec:
        if key not in RAY_DEFAULTS:
            raise ConfigError(
                f"launcher.{key}",
                f"unknown option{did_you_mean(key, RAY_DEFAULTS)};"
                f" the ray launcher takes {options}",
            )
    out = {**RAY_DEFAULTS, **spec}
    out["num_workers"] = _worker_count(out["num_workers"])
    if (
        not isinstance(out["elastic_resize_monitor_interval_s"], (int, float))
        or out["elastic_resize_monitor_interval_s"] < 0
    ):
        raise ConfigError("launcher.elastic_resize_monitor_interval_s", "must be seconds >= 0")
    if not isinstance(out["max_failures"], int) or out["max_failures"] < -1:
        raise ConfigError("launcher.max_failures", "must be an int >= 0 (or -1: no limit)")
    if out["placement_strategy"] not in PLACEMENT_STRATEGIES:
        raise ConfigError(
            "launcher.placement_strategy", f"must be one of {', '.join(PLACEMENT_STRATEGIES)}"
        )
    res = out["resources_per_worker"]
    if res is not None and (
        not isinstance(res, dict) or not all(isinstance(v, (int, float)) for v in res.values())
    ):
        raise ConfigError("launcher.resources_per_worker", "must be a dict like {'CPU': 2}")
    return out


def _worker_count(value: Any) -> int | tuple[int, int]:
    """``num_workers``: an int >= 1, or ``(min, max)`` (a list after a round trip through
    plain config) for an elastic group."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 1 <= value[0] <= value[1]
    ):
        return (value[0], value[1]) if value[0] < value[1] else value[0]
    raise ConfigError(
        "launcher.num_workers",
        f"must be an int >= 1 or (min, max) with 1 <= min <= max, got {value!r}",
    )


def validate_config(cfg: dict) -> None:
    """Check on the Ray driver, before any worker starts, that the config will build — without
    building the model or the data.

    The config is prepared as each worker's ``Runner.from_cfg`` prepares it
    (:func:`~distributed_runner.config_prep.prepare_config`), on a copy: the workers get it as
    given and log the iMIX notes themselves; the device is theirs to check. Then what is the
    driver's own: the hooks planned (built and checked; their sinks checked, not built), the sizes
    of an elastic group, and models, datasets, metrics, optimizers and schedulers resolved, their
    arguments matched against the constructors' signatures.
    """
    from .hook_builder import plan_hooks

    cfg, _ = prepare_config(dict(cfg), check_device=False)
    plan_hooks(cfg)
    check_elastic_config(cfg)  # every size of an elastic group splits the global batch evenly
    _check_spec(registry.MODELS, cfg["model"], "model")
    for stage in ("train", "val", "test"):
        loader = cfg.get(f"{stage}_dataloader")
        if isinstance(loader, dict) and loader.get("type") != "RayDataLoader":
            _check_spec(registry.DATASETS, loader.get("dataset"), f"{stage}_dataloader.dataset")
        evaluator = cfg.get(f"{stage}_evaluator")
        if isinstance(evaluator, list):
            for i, metric in enumerate(evaluator):
                _check_spec(registry.METRICS, metric, f"{stage}_evaluator[{i}]")
        else:
            _check_spec(registry.METRICS, evaluator, f"{stage}_evaluator")
    _check_optim_parts(cfg)


def _check_spec(reg: Any, spec: Any, key: str, supplied: tuple = ()) -> None:
    """A ``dict(type=...)`` resolves in ``reg`` and its arguments fit the constructor (anything
    else, e.g. an object already built, is left to the worker)."""
    if isinstance(spec, dict):
        if "type" not in spec:
            raise ConfigError(key, "missing 'type'")
        cls = reg.resolve(spec["type"], key)
        check_arguments(cls, {k: v for k, v in spec.items() if k != "type"}, key, supplied=supplied)


def _check_optim_parts(cfg: dict) -> None:
    """The optimizer, the paramwise options and the schedulers, resolved without a model."""
    optim = cfg.get("optim_wrapper")
    if isinstance(optim, dict):
        _check_spec(
            registry.OPTIMIZERS,
            optim.get("optimizer"),
            "optim_wrapper.optimizer",
            supplied=("params",),
        )
        if "paramwise_cfg" in optim or "constructor" in optim:
            from .optim import constructor_for

            constructor_for(optim)  # checks its options without a model
    schedulers = cfg.get("param_scheduler")
    for i, sched in enumerate(schedulers if isinstance(schedulers, list) else [schedulers]):
        if isinstance(sched, dict) and "type" in sched:
            registry.PARAM_SCHEDULERS.resolve(sched["type"], f"param_scheduler[{i}]")


def run(cfg: dict) -> int:
    """Train ``cfg`` with the launcher it names; returns the process exit status."""
    launcher = normalize_launcher(cfg.get("launcher"))
    if launcher is None:
        from .runner import Runner

        Runner.from_cfg(cfg).train()
        return 0
    return RayLauncher(cfg, launcher).train()


class RayLauncher:
    """Driver side of a Ray Train run."""

    def __init__(self, cfg: dict, launcher: dict) -> None:
        self.cfg = cfg
        self.opts = launcher
        self.work_dir = Path(announced_path(str(cfg["work_dir"]), "work_dir"))
        self.storage_path = (
            announced_path(str(launcher["storage_path"]), "launcher.storage_path")
            if launcher["storage_path"]
            else str(self.work_dir / "ray_storage")
        )
        self.name = launcher["name"] or self.work_dir.name
        self.joined = "a local Ray started by this process"

    # -- cluster -------------------------------------------------------------------------------
    def connect(self) -> None:
        """Join the cluster the launcher names (see :func:`ray_connect.resolve_address`), or
        start a local one."""
        import ray

        if ray.is_initialized():
            self.joined = (
                f"the Ray cluster this process is connected to "
                f"({ray.get_runtime_context().gcs_address})"
            )
            return
        address = resolve_address(self.opts["address"])
        if address:
            probe_address(address)
            ray.init(address=address, log_to_driver=True)
            self.joined = f"the Ray cluster at {ray.get_runtime_context().gcs_address}"
        else:
            start_local_ray()

    @property
    def min_workers(self) -> int:
        workers = self.opts["num_workers"]
        return workers[0] if isinstance(workers, tuple) else workers

    def workers_text(self) -> str:
        workers = self.opts["num_workers"]
        return (
            f"{workers[0]}-{workers[1]} workers (elastic)"
            if isinstance(workers, tuple)
            else f"{workers} workers"
        )

    def worker_resources(self) -> dict[str, float]:
        res = dict(self.opts["resources_per_worker"] or {})
        res.setdefault("CPU", 1)
        if self.opts["use_gpu"]:
            res.setdefault("GPU", 1)
        return res

    def check_resources(self, total: dict[str, float]) -> None:
        """One-line errors for a request the cluster cannot meet (Ray would wait forever)."""
        n = self.min_workers  # an elastic group starts when its minimum fits
        for resource, each in self.worker_resources().items():
            have = float(total.get(resource, 0))
            if each * n > have:
                key = "launcher.use_gpu" if resource == "GPU" else "launcher.num_workers"
                raise ConfigError(
                    key,
                    f"{n} workers x {each:g} {resource} need {each * n:g} "
                    f"{resource}, the cluster has {have:g}: lower "
                    f"num_workers/resources_per_worker or add nodes",
                )
        if self._uses_ray_data():
            spare = float(total.get("CPU", 0)) - self.worker_resources()["CPU"] * n
            if spare < 1:
                raise ConfigError(
                    "launcher.num_workers",
                    f"the training workers take all {total.get('CPU', 0):g} CPUs "
                    f"and Ray Data would starve (it needs CPUs of its own to read "
                    f"and shuffle): lower num_workers or add CPUs",
                )

    def _uses_ray_data(self) -> bool:
        loader = self.cfg.get("train_dataloader")
        return isinstance(loader, dict) and loader.get("type") == "RayDataLoader"

    # -- the run -------------------------------------------------------------------------------
    def build_trainer(self) -> Any:
        import ray
        import ray.train
        from ray.train.torch import TorchConfig, TorchTrainer

        from .ray_data import build_ray_datasets
        from .ray_worker import train_worker

        plain = to_plain(self.cfg)
        plain["work_dir"] = str(self.work_dir)
        # the resolved run name travels too: sinks tag the run with it
        plain["launcher"] = {**self.opts, "name": self.name, "storage_path": self.storage_path}
        datasets = build_ray_datasets(plain) if self._uses_ray_data() else None
        # the config file and its git commit are the driver's: workers may not have the file
        source = self.cfg.source() if isinstance(self.cfg, Config) else None
        # the driver's MLFLOW_* and WANDB_* for every worker, by reference: never shown in job
        # metadata
        env = ray.put(forwarded_env())
        return TorchTrainer(
            train_worker,
            train_loop_config={"cfg": plain, "source": source, "env": env},
            scaling_config=ray.train.ScalingConfig(
                num_workers=self.opts["num_workers"],
                use_gpu=self.opts["use_gpu"],
                # Ray 2.60 binds ray.train.ScalingConfig to Train v2's (RAY_TRAIN_V2_ENABLED is
                # on by default), which takes this; mypy reads the v1 class bound first
                elastic_resize_monitor_interval_s=self.opts[  # type: ignore[call-arg]
                    "elastic_resize_monitor_interval_s"
                ],
                resources_per_worker=self.opts["resources_per_worker"],
                placement_strategy=self.opts["placement_strategy"],
            ),
            run_config=ray.train.RunConfig(
                name=self.name,
                storage_path=self.storage_path,
                failure_config=ray.train.FailureConfig(max_failures=self.opts["max_failures"]),
            ),
            torch_config=TorchConfig(backend="nccl" if self.opts["use_gpu"] else "gloo"),
            datasets=datasets,
        )

    def fit(self) -> Any:
        """Validate, connect, check resources, run the trainer; returns Ray's ``Result``
        (raises ``ray.train.TrainingFailedError`` when the workers failed)."""
        import ray

        validate_config(self.cfg)
        check_storage(self.storage_path)
        self.connect()
        self.check_resources(ray.cluster_resources())
        print(f"distributed-runner on Ray: joined {self.joined}", flush=True)
        print(
            f"distributed-runner on Ray: {self.workers_text()}"
            f"{' with GPUs' if self.opts['use_gpu'] else ''} | run {self.name!r} | storage "
            f"{self.storage_path}/{self.name} | work_dir {self.work_dir}{self._mlflow_note()}",
            flush=True,
        )
        return self.build_trainer().fit()

    def train(self) -> int:
        """:meth:`fit` for the command line: the process exit status."""
        from ray.train import TrainingFailedError

        try:
            self.fit()
        except TrainingFailedError as e:
            print(f"drun: training failed on the Ray workers: {_first_lines(e)}", file=sys.stderr)
            mark_mlflow_run_failed(self.work_dir, self.mlflow_uri())
            return 1
        print(
            f"distributed-runner on Ray: finished; checkpoints in {self.storage_path}/{self.name}",
            flush=True,
        )
        return 0

    def mlflow_uri(self) -> str | None:
        """Where rank 0 logs when the logger has an MLflow sink (the config's URI, else the
        ``MLFLOW_TRACKING_URI`` forwarded to the workers, else the SQLite fallback)."""
        logger = (self.cfg.get("default_hooks") or {}).get("logger")
        sinks = logger.get("sinks", []) if isinstance(logger, dict) else []
        for sink in sinks:
            spec = {"type": sink} if isinstance(sink, str) else sink
            if isinstance(spec, dict) and spec.get("type") in ("mlflow", "MLflowSink"):
                from .sinks.mlflow import tracking_uri

                return tracking_uri(spec.get("tracking_uri"), self.work_dir)
        return None

    def _mlflow_note(self) -> str:
        """`` | MLflow <uri>`` (its password redacted) when the logger has an MLflow sink."""
        uri = self.mlflow_uri()
        return f" | MLflow {redact_url(uri)}" if uri else ""


def mark_mlflow_run_failed(work_dir: Path, uri: str | None) -> None:
    """After the workers gave up, end the run's MLflow run as FAILED (rank 0 died before it could
    say so). Best effort: the run file is on the driver only when work_dir is shared."""
    from .sinks.mlflow import RUN_FILE

    run_file = work_dir / RUN_FILE
    if uri is None or not run_file.is_file():
        return
    try:
        info = json.loads(run_file.read_text())
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"  # it shows the password
        from mlflow.tracking import MlflowClient

        MlflowClient(uri).set_terminated(info["run_id"], "FAILED")
    except Exception as e:  # noqa: BLE001 - the failure is already reported
        print(
            f"drun: could not mark the MLflow run FAILED ({type(e).__name__}: {e})", file=sys.stderr
        )


def _first_lines(error: BaseException, n: int = 12) -> str:
    text = str(error).strip().splitlines()
    return "\n".join(text[:n])
