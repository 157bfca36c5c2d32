"""Launchers: run a config in this process (``launcher='none'``) or on Ray Train workers.

``launcher=dict(type='ray', num_workers=2, use_gpu=False, resources_per_worker=None,
placement_strategy='PACK', address=None, storage_path=None, name=None, max_failures=0,
elastic_resize_monitor_interval_s=60)``; ``num_workers=(min, max)`` is an elastic group
(:mod:`distributed_runner.data.elastic`).

On Ray the driver only loads and checks: it validates the config (every ``type`` resolves, every
argument exists) and the resource request against the cluster — a request the cluster cannot meet
is a one-line error within seconds rather than a trainer waiting forever — and then runs a Ray
Train ``TorchTrainer`` whose workers each build the Runner from the plain config dict
(:func:`distributed_runner.launch.ray_worker.train_worker`). The driver never builds the model.

* no ``address`` and no ``RAY_ADDRESS``: a local Ray is started in this process;
  ``address='auto'`` (or ``RAY_ADDRESS``) joins the one running cluster (``ray start --head``) and
  refuses when several run on the machine; the driver prints which cluster it joined, and forwards
  its ``MLFLOW_*`` and ``WANDB_*`` environment to the workers
  (:mod:`distributed_runner.launch.ray_connect`).
* The driver names the run once (:func:`~distributed_runner.checkpoint.resume_choice.choose_run`:
  a new timestamped folder under ``work_dir``, or with ``--resume`` the newest run that has a
  checkpoint) and every worker writes into that folder. ``name`` (Ray's run name) defaults to
  the run's folder name. ``storage_path`` defaults to ``work_dir/ray_storage``; multi-node runs
  point it at shared storage (an NFS path or ``s3://``). Relative paths inside a ``ray job
  submit`` package folder go under ``$DRUN_WORK_ROOT`` (``~/drun``).
* ``max_failures``: how many times Ray restarts the worker group after a worker dies; each restart
  resumes exactly from the last checkpoint Ray holds.
* With ``fault_tolerance`` the workers are replica actors, not a Ray Train group: a lost one is
  replaced alone (:mod:`distributed_runner.launch.ray_replicas`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from distributed_runner.core.config import Config, runs_in_process
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.preemption import INTERRUPT, TrainingPreempted
from distributed_runner.core.redact import redact_url
from distributed_runner.core.storage import is_remote
from distributed_runner.launch.launcher_config import (  # noqa: F401  (re-exported: the launcher's public names)
    PLACEMENT_STRATEGIES,
    RAY_DEFAULTS,
    normalize_launcher,
    uses_ray_data,
    validate_config,
    worker_resources,
)
from distributed_runner.launch.ray_connect import (
    announced_path,
    check_storage,
    forwarded_env,
    probe_address,
    resolve_address,
    start_local_ray,
)
from distributed_runner.launch.run_control import RunControl, ctrl_c_pauses
from distributed_runner.validation.async_validation import check_val_resources


def run(cfg: dict) -> int:
    """Train ``cfg`` with the launcher it names; returns the process exit status."""
    if runs_in_process(cfg.get("launcher")):
        from distributed_runner.engine.runner import Runner

        if cfg.get("fault_tolerance"):  # replica processes and their replacements
            from distributed_runner.launch.replicas import ReplicaLauncher

            return ReplicaLauncher(cfg).run()

        Runner.from_cfg(cfg).train()
        return 0
    return RayLauncher(cfg).train()


def test(cfg: dict) -> dict:
    """``drun test``: the test loop over ``cfg['load_from']`` where ``cfg``'s launcher runs
    (in this process, or on the Ray workers: a model cut into pipeline stages or sharded by
    FSDP is tested as it trains); the metrics."""
    if runs_in_process(cfg.get("launcher")):
        from distributed_runner.engine.runner import Runner

        return Runner.from_cfg(cfg).test()
    return RayLauncher(cfg).test()


class RayLauncher:
    """Driver side of a Ray Train run."""

    def __init__(self, cfg: dict, launcher: dict | None = None) -> None:
        """``cfg`` is checked here, once (:func:`validate_config`: every section parsed, every
        driver step run, no worker started); ``launcher`` overrides its launcher section (a
        sweep's trial passes the one it resolved)."""
        self.cfg = cfg
        self.plan = validate_config(cfg if launcher is None else {**cfg, "launcher": launcher})
        self.settings = self.plan.settings
        opts = self.settings.launcher  # normalize_launcher's: None for 'none'
        if opts is None:
            raise ConfigError("launcher", "the Ray launcher needs launcher=dict(type='ray', ...)")
        self.opts: dict = opts
        self.work_dir = Path(announced_path(str(cfg["work_dir"]), "work_dir"))
        self.storage_path = (
            announced_path(str(opts["storage_path"]), "launcher.storage_path")
            if opts["storage_path"]
            else str(self.work_dir / "ray_storage")
        )
        self.run_name: str | None = cfg.get("run_name")  # chosen in fit() when None
        self.tested: dict | None = None  # drun test's metrics (rank 0's), after fit('test')
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
        return worker_resources(self.opts)

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
        check_val_resources(self.settings.val_cfg, self.worker_resources(), n, total)
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
        return uses_ray_data(self.cfg)

    # -- the run -------------------------------------------------------------------------------
    def build_trainer(self, control: str | None = None, command: str = "train") -> Any:
        import ray
        import ray.train
        from ray.train.torch import TorchConfig, TorchTrainer

        from distributed_runner.core.ray_private import no_dataset_actor_without_datasets
        from distributed_runner.data.ray_data import build_ray_datasets
        from distributed_runner.health.hang_watch import hang_watch_callbacks
        from distributed_runner.launch.ray_retention import ray_checkpoint_config
        from distributed_runner.launch.ray_worker import train_worker
        from distributed_runner.launch.validation_worker import trainer_kwargs

        plain = dict(self.plan.cfg)  # prepared and checked, its paths made absolute
        plain["work_dir"] = str(self.work_dir)
        plain["run_name"] = self.run_name  # chosen once, here: every worker writes there
        # the resolved run name travels too: sinks tag the run with it
        plain["launcher"] = {**self.opts, "name": self.name, "storage_path": self.storage_path}
        plain = self._write_stored(plain)  # the shards' index: the workers read no footer
        datasets = build_ray_datasets(plain) if self._uses_ray_data() else None
        # the config file and its git commit are the driver's: workers may not have the file
        source = self.cfg.source() if isinstance(self.cfg, Config) else None
        # the driver's MLFLOW_* and WANDB_* for every worker, by reference: never shown in job
        # metadata; AWS_* too when a section reads object storage (its driver step said so)
        stored_remote = bool(self.plan.stored) and is_remote(self.storage_path)
        env = ray.put(forwarded_env(reads_object_storage=self.plan.remote or stored_remote))
        watchdog = self.settings.watchdog  # hang watch: health/hang_watch.py
        config: dict[str, Any] = {"cfg": plain, "source": source, "env": env, "control": control}
        config["command"] = command
        config["notes"] = self.plan.notes  # iMIX translations: each worker logs them
        trainer = TorchTrainer(
            train_worker,
            train_loop_config=config,
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
                callbacks=hang_watch_callbacks(watchdog, str(self.run_dir)),
                # no more checkpoints in Ray's storage than in the run's folder, the newest always
                checkpoint_config=ray_checkpoint_config(plain, self.settings.val_cfg),
            ),
            torch_config=TorchConfig(
                backend="nccl" if self.opts["use_gpu"] else "gloo",
                timeout_s=round(watchdog["collective_timeout"]),
            ),
            datasets=datasets,
            **trainer_kwargs(plain, self.settings.val_cfg),  # async validation's Ray tasks
        )
        no_dataset_actor_without_datasets(trainer)  # a process less per group start
        return trainer

    def _write_stored(self, plain: dict) -> dict:
        """The driver steps' files (:class:`~distributed_runner.engine.sections.Stored`) written
        into the run's Ray storage, and ``plain`` with their keys naming them (copied along each
        key's path: the driver's own config stays as it was)."""
        for item in self.plan.stored:
            uri = f"{self.storage_path.rstrip('/')}/{self.name}/{item.relative}"
            item.value.write(uri)
            plain = _with_value(plain, item.config_path, uri)
        return plain

    def fit(self, command: str = "train") -> Any:
        """Validate, connect, check resources, run the trainer (``command``: 'train', or
        'test' for ``drun test``); returns Ray's ``Result`` (raises
        ``ray.train.TrainingFailedError`` when the workers failed)."""
        import ray

        from distributed_runner.core.ray_private import keep_driver_sigint

        check_storage(self.storage_path)
        self.connect()
        self.check_resources(ray.cluster_resources())
        self.choose_run()
        print(f"distributed-runner on Ray: joined {self.joined}", flush=True)
        print(
            f"distributed-runner on Ray: {self.workers_text()}"
            f"{' with GPUs' if self.opts['use_gpu'] else ''} | run {self.run_dir} | Ray "
            f"storage {self.storage_path}/{self.name}{self.mlflow_note()}",
            flush=True,
        )
        control = RunControl(f"drun-control-{self.name}-{os.getpid()}-{time.time_ns()}")
        try:
            trainer = self.build_trainer(control.name, command)
            with ctrl_c_pauses(control, keep_driver_sigint(trainer)):
                result = trainer.fit()
            paused = control.paused_at()
            self.tested = control.test_metrics() if command == "test" else None
        finally:
            with contextlib.suppress(Exception):  # the store gone with the head node
                control.clear()
        if paused is not None:  # Ctrl-C: the workers saved a checkpoint and returned
            raise TrainingPreempted((INTERRUPT,), paused[1], iteration=paused[0])
        return result

    def choose_run(self) -> None:
        """The run's folder, once for every worker (the config's ``run_name``, else a new one or,
        resuming, the newest that has a checkpoint), and Ray's run name (default the same)."""
        from distributed_runner.checkpoint.resume_choice import choose_run

        self.run_name = choose_run(self.work_dir, self.run_name, self.cfg.get("resume"))

    @property
    def run_dir(self) -> Path:
        """The run's folder under work_dir (:meth:`choose_run` names it)."""
        from distributed_runner.core.run_folders import run_dir

        if self.run_name is None:
            raise RuntimeError("the run is not named yet: fit() names it")
        return run_dir(self.work_dir, self.run_name)

    @property
    def name(self) -> str:
        """Ray's name for the run: ``launcher.name``, else the run's folder name."""
        from distributed_runner.core.run_folders import FLAT

        if self.opts["name"]:
            return str(self.opts["name"])
        return self.work_dir.name if self.run_name in (None, FLAT) else str(self.run_name)

    def train(self) -> int:
        """:meth:`fit` for the command line: the process exit status (1: the workers failed, one
        line per distinct error and one stack). A ConfigError a worker raised is raised here:
        ``drun`` prints it as its one line and exits 2, as for a mistake the driver finds."""
        from ray.train import TrainingFailedError

        if self.settings.fault_tolerance is not None:  # replica actors, replaced alone
            from distributed_runner.launch.ray_replicas import train_on_ray

            return train_on_ray(self)
        try:
            self.fit()
        except TrainingFailedError as e:
            config_error = worker_config_error(e)
            if config_error is None:
                print(
                    f"drun: training failed on the Ray workers: {failure_report(e)}",
                    file=sys.stderr,
                )
            mark_mlflow_run_failed(self.run_dir, self.mlflow_uri())
            if config_error is not None:  # a mistake only a worker could see: drun's one line
                raise config_error from None
            return 1
        print(
            f"distributed-runner on Ray: finished; run {self.run_dir} (Ray's copies in "
            f"{self.storage_path}/{self.name})",
            flush=True,
        )
        return 0

    def test(self) -> dict:
        """``drun test`` on the workers: rank 0's metrics (every rank's are the same: the
        evaluator gathers them), sent through the run's keys; a ConfigError a worker raised is
        raised here as its one line, another failure with the report :meth:`train` prints."""
        from ray.train import TrainingFailedError

        try:
            self.fit("test")
        except TrainingFailedError as e:
            config_error = worker_config_error(e)
            if config_error is not None:
                raise config_error from None
            raise RuntimeError(f"testing failed on the Ray workers: {failure_report(e)}") from None
        if self.tested is None:
            raise RuntimeError(f"the Ray workers tested {self.run_dir} but sent no metrics")
        return self.tested

    def mlflow_uri(self) -> str | None:
        """Where rank 0 logs when the logger has an MLflow sink (the config's URI, else the
        ``MLFLOW_TRACKING_URI`` forwarded to the workers, else the SQLite fallback)."""
        logger = (self.cfg.get("default_hooks") or {}).get("logger")
        sinks = logger.get("sinks", []) if isinstance(logger, dict) else []
        for sink in sinks:
            spec = {"type": sink} if isinstance(sink, str) else sink
            if isinstance(spec, dict) and spec.get("type") in ("mlflow", "MLflowSink"):
                from distributed_runner.tracking.sinks.mlflow import tracking_uri

                return tracking_uri(spec.get("tracking_uri"), self.work_dir)
        return None

    def mlflow_note(self) -> str:
        """`` | MLflow <uri>`` (its password redacted) when the logger has an MLflow sink."""
        uri = self.mlflow_uri()
        return f" | MLflow {redact_url(uri)}" if uri else ""


def _with_value(cfg: dict, path: tuple[str, ...], value: Any) -> dict:
    """``cfg`` with ``cfg[path[0]][path[1]]... = value``, the dicts on the path copied."""
    head, *rest = path
    return {**cfg, head: _with_value(cfg[head], tuple(rest), value) if rest else value}


def mark_mlflow_run_failed(work_dir: Path, uri: str | None) -> None:
    """After the workers gave up, end the run's MLflow run as FAILED (rank 0 died before it could
    say so). Best effort: the run file is on the driver only when work_dir is shared."""
    from distributed_runner.tracking.sinks.mlflow import RUN_FILE

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


# -- what the workers raised, on the driver's terminal ------------------------------------------
def worker_failures(error: BaseException) -> list[tuple[int, BaseException]]:
    """(rank, exception) of each failed worker of a ``ray.train.WorkerGroupError`` (its
    ``worker_failures``), the first to fail first (the time each worker recorded with it,
    :data:`~distributed_runner.launch.ray_worker.FAILURE`; else by rank); empty for a failure
    of Ray's controller or a hang the watch ended."""
    from distributed_runner.launch.ray_worker import FAILURE

    failures = getattr(error, "worker_failures", None)
    if not isinstance(failures, dict):
        return []

    def first(item: tuple[int, BaseException]) -> tuple[bool, float, int]:
        at = (getattr(item[1], FAILURE, None) or {}).get("at")
        return at is None, float(at or 0.0), int(item[0])

    return sorted(failures.items(), key=first)


def worker_config_error(error: BaseException) -> ConfigError | None:
    """The first ConfigError a worker raised (the cause: other ranks fail on its account)."""
    return next((e for _, e in worker_failures(error) if isinstance(e, ConfigError)), None)


def failure_report(error: BaseException) -> str:
    """What follows ``drun: training failed on the Ray workers:``: each distinct error's line
    and its ranks, the first to fail first, then one stack (every failing rank's is in the run's
    log); Ray's own text, shortened, when no worker raised (:func:`worker_failures`)."""
    from distributed_runner.launch.ray_worker import FAILURE, one_line

    failures = worker_failures(error)
    if not failures:
        return _first_lines(error)
    ranks: dict[str, list[int]] = {}
    for rank, failure in failures:
        line = (getattr(failure, FAILURE, None) or {}).get("line") or one_line(failure)
        ranks.setdefault(line, []).append(rank)
    lines = [f"{line} ({_ranks(which)})" for line, which in ranks.items()]
    stacked = [(r, getattr(f, FAILURE)) for r, f in failures if getattr(f, FAILURE, None)]
    if stacked:
        rank, info = stacked[0]
        lines.append(f"rank {rank}'s stack (every failing rank's is in {info['log']}):")
        lines.append(str(info["stack"]).rstrip())
    return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
