"""``drun tune``: check the sweep, join or start Ray, run Tune, write the results.

In order: the ``tune`` block and one sampled trial's config are checked before Ray starts (every
mistake one line, status 2); ``--dry-run`` stops there and shows a few trials' values. Then Ray
is joined (``--address auto``) or started the way ``drun train --launcher ray`` starts it (with
the dashboard and ``RAY_ADDRESS``, which Ray Train's placement-group cleaner needs), trials keep
the working directory (``RAY_CHDIR_TO_TRIAL_DIR=0``: relative data paths work), and the number of
concurrent trials is what the cluster fits — a larger ``max_concurrent_trials`` is refused, since
Tune does not count Ray Train workers and over-subscribed trials wait forever. ``--resume``
continues the sweep in ``work_dir`` (Tune's ``Tuner.restore``): finished trials are kept,
unfinished ones resume from their checkpoints, the MLflow parent run is the same one.

Exit status: 0; 1 when a trial failed; 130 when the sweep was interrupted (``--resume``
continues it).
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path
from typing import Any

from distributed_runner.core.config import to_plain
from distributed_runner.core.errors import ConfigError
from distributed_runner.launch.launcher_config import validate_config
from distributed_runner.launch.ray_connect import probe_address, resolve_address, start_local_ray
from distributed_runner.tune import mlflow_parent, results
from distributed_runner.tune.algorithms import build_scheduler, build_searcher
from distributed_runner.tune.cli_args import apply_tune_flags
from distributed_runner.tune.domains import sample, to_tune
from distributed_runner.tune.spec import SweepSpec, _train_shape, parse_tune
from distributed_runner.tune.status import TrialStatusCallback, read_statuses
from distributed_runner.tune.trainable import DrunTrainable, ray_trial_api
from distributed_runner.tune.trial_config import trial_config

INTERRUPTED_EXIT_CODE = 130


def _trial_resources(spec: SweepSpec, cfg: dict) -> dict[str, float]:
    if spec.trial_launcher == "ray":
        return dict(ray_trial_api().ray_trial_resources(cfg))
    return dict(spec.resources_per_trial or {"CPU": 1.0})


def trial_threads(spec: SweepSpec, cfg: dict) -> int:
    """The torch threads a trial's training process gets on Ray: ``OMP_NUM_THREADS`` when this
    process sets it (Ray passes it on), else the whole CPUs the process holds (a Ray Train
    trial's workers: ``resources_per_worker``; an in-process trial: ``resources_per_trial``),
    at least 1 — what Ray sets ``OMP_NUM_THREADS`` to."""
    configured = os.environ.get("OMP_NUM_THREADS", "")
    if configured.isdigit() and int(configured) > 0:
        return int(configured)
    if spec.trial_launcher == "ray":
        from distributed_runner.launch.launcher_config import worker_resources
        from distributed_runner.tune.ray_trial_resources import ray_launcher_opts

        cpus = worker_resources(ray_launcher_opts(cfg)).get("CPU", 1.0)
    else:
        cpus = _trial_resources(spec, cfg).get("CPU", 1.0)
    return max(1, int(cpus))


def pin_trial_threads(spec: SweepSpec, cfg: dict) -> None:
    """``env_cfg.num_threads`` set to :func:`trial_threads` unless the config sets it: every
    trial then runs with it, and so does ``best_config.py`` (written from this config), which
    therefore repeats its trial's losses exactly (:mod:`distributed_runner.core.env_cfg`)."""
    env_cfg = dict(cfg.get("env_cfg") or {})
    if env_cfg.get("num_threads") is None:
        env_cfg["num_threads"] = trial_threads(spec, cfg)
        cfg["env_cfg"] = env_cfg


def trials_that_fit(spec: SweepSpec, cfg: dict, cluster: dict[str, float]) -> int:
    """How many trials the cluster runs at once."""
    if spec.trial_launcher == "ray":
        return int(ray_trial_api().ray_trials_that_fit(cfg, cluster))
    need = _trial_resources(spec, cfg)
    return min(int(float(cluster.get(k, 0)) // v) for k, v in need.items() if v > 0)


def _trial_footprint(spec: SweepSpec, cfg: dict) -> dict[str, float]:
    """All a running trial holds: for a Ray Train trial its workers too (Tune sees only the
    actor)."""
    if spec.trial_launcher == "ray":
        return dict(ray_trial_api().ray_trial_footprint(cfg))
    return _trial_resources(spec, cfg)


def _amount(resource: str, value: float) -> str:
    return (
        f"{value / (1 << 30):.3g} GiB memory" if resource == "memory" else f"{value:g} {resource}"
    )


def choose_concurrency(spec: SweepSpec, cfg: dict, cluster: dict[str, float]) -> int:
    """``max_concurrent_trials``, or what fits; one line when it does not fit."""
    fit = trials_that_fit(spec, cfg, cluster)
    need = _trial_footprint(spec, cfg)
    # the resources that limit it: those that fit only ``fit`` times
    limiting = [k for k, v in need.items() if float(cluster.get(k, 0)) / v < fit + 1] or list(need)
    shown = ", ".join(_amount(k, need[k]) for k in limiting)
    have = ", ".join(_amount(k, float(cluster.get(k, 0))) for k in limiting)
    if fit < 1:
        if spec.trial_launcher == "ray":
            raise ConfigError(
                "launcher.num_workers",
                f"a Ray Train trial holds {shown} (its workers), the cluster has {have}: "
                "fewer workers (--num-workers) or more nodes",
            )
        raise ConfigError(
            "tune.resources_per_trial",
            f"a trial needs {shown}, the cluster has {have}: lower it or add nodes",
        )
    wanted = spec.max_concurrent_trials
    if wanted is not None and wanted > fit:
        raise ConfigError(
            "tune.max_concurrent_trials",
            f"{wanted} trials x ({shown}) do not fit in the cluster's {have}: at most {fit} "
            f"(more would wait for resources forever)",
        )
    return wanted or fit


def _check_trial(cfg: dict, spec: SweepSpec, work_dir: Path) -> list[dict[str, Any]]:
    """A few sampled trials' values; the first one's config is checked as ``drun train`` would."""
    rng = random.Random(0)
    samples = [{k: sample(d, rng) for k, d in spec.space.items()} for _ in range(3)]
    trial = trial_config(cfg, samples[0], "check", str(work_dir / "trials" / "check"))
    if spec.trial_launcher == "none":
        trial["launcher"] = "none"
    validate_config(trial)
    return samples


def _connect(address: str | None) -> bool:
    """Join or start Ray; True when this process started it."""
    import ray

    os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"  # trials keep the working directory
    if ray.is_initialized():
        return False
    resolved = resolve_address(address)
    if resolved:
        probe_address(resolved)
        ray.init(address=resolved, log_to_driver=True)
        print(f"drun tune: joined the Ray cluster at {ray.get_runtime_context().gcs_address}")
        return False
    start_local_ray()
    return True


def _tuner(
    spec: SweepSpec,
    cfg: dict,
    sweep: dict,
    storage: Path,
    name: str,
    concurrency: int,
    resume: bool,
) -> Any:
    from ray import tune

    trainable = tune.with_resources(
        tune.with_parameters(DrunTrainable, sweep=sweep), _trial_resources(spec, cfg)
    )
    path = storage / name
    sweep_dir = Path(sweep["work_dir"])
    if resume:
        if not tune.Tuner.can_restore(str(path)):
            raise ConfigError("--resume", f"no sweep to continue at {path}")
        return tune.Tuner.restore(str(path), trainable, resume_unfinished=True)
    if (path / "tuner.pkl").exists():
        raise ConfigError(
            "work_dir",
            f"a sweep already ran in {path}: --resume continues it, or pick another --work-dir",
        )
    scheduler_options = dict(spec.scheduler_options)
    for key in ("hyperparam_mutations",):
        if key in scheduler_options:
            scheduler_options[key] = {k: to_tune(d) for k, d in scheduler_options[key].items()}
    return tune.Tuner(
        trainable,
        param_space={k: to_tune(d) for k, d in spec.space.items()},
        tune_config=tune.TuneConfig(
            num_samples=spec.num_samples,
            # a random/grid generator takes it itself (build_searcher); Tune would only warn
            max_concurrent_trials=None if spec.search_alg in ("random", "grid") else concurrency,
            scheduler=build_scheduler(spec.scheduler, scheduler_options, spec.metric, spec.mode),
            search_alg=build_searcher(
                spec.search_alg, spec.search_options, spec.metric, spec.mode, concurrency
            ),
            time_budget_s=spec.time_budget_s,
            reuse_actors=False,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(storage),
            failure_config=tune.FailureConfig(max_failures=spec.max_failures),
            # PBT exploits a donor's checkpoint that may be several results old: keep them all
            callbacks=[TrialStatusCallback(sweep_dir)],
            checkpoint_config=tune.CheckpointConfig(
                num_to_keep=None if spec.scheduler in ("PBT", "PB2") else 2
            ),
            verbose=1,
        ),
    )


def run_sweep(cfg: dict, args: argparse.Namespace) -> int:
    """The body of ``drun tune`` (``cfg`` loaded with the common flags applied)."""
    apply_tune_flags(cfg, args)
    spec = parse_tune(cfg)
    work_dir = Path(str(cfg["work_dir"])).expanduser().resolve()
    samples = _check_trial(cfg, spec, work_dir)
    by_epoch, length, _ = _train_shape(cfg)
    unit = "epoch" if by_epoch else "iter"
    print(
        f"drun tune: {spec.metric} ({spec.mode}) over {', '.join(spec.space)} | "
        f"{spec.num_samples} sample(s), search {spec.search_alg}, scheduler {spec.scheduler}, "
        f"trials {spec.trial_launcher!r}",
        flush=True,
    )
    if args.dry_run:
        for i, values in enumerate(samples):
            print(f"  trial {i}: " + ", ".join(f"{k}={v!r}" for k, v in values.items()))
        return 0
    name = spec.name or work_dir.name
    storage = (
        Path(spec.storage_path).expanduser().resolve()
        if spec.storage_path
        else (work_dir / "tune_storage")
    )
    work_dir.mkdir(parents=True, exist_ok=True)
    mlflow = mlflow_parent.mlflow_settings(cfg, work_dir, name)
    parent = None
    if mlflow is not None:
        parent = mlflow_parent.open_parent(
            mlflow, work_dir, {"tune.metric": spec.metric, "tune.scheduler": spec.scheduler}
        )
        mlflow["parent_run_id"] = parent
    launcher = cfg.get("launcher")
    address = args.address or (launcher.get("address") if isinstance(launcher, dict) else None)
    started = _connect(address)
    try:
        import ray

        concurrency = choose_concurrency(spec, cfg, ray.cluster_resources())
        pin_trial_threads(spec, cfg)
        print(f"drun tune: up to {concurrency} trial(s) at once | storage {storage}/{name}")
        base = to_plain(cfg)
        sweep = {
            "base": base,
            "work_dir": str(work_dir),
            "trial_launcher": spec.trial_launcher,
            "stop_grace_s": spec.stop_grace_s,
            "mlflow": mlflow,
        }
        grid = _tuner(spec, cfg, sweep, storage, name, concurrency, args.resume).fit()
        statuses = read_statuses(work_dir)
        rows = results.trial_rows(grid, statuses, spec.metric, spec.mode, length, unit, work_dir)
    finally:
        if started:
            import ray

            ray.shutdown()
    return _finish(cfg, spec, rows, work_dir, mlflow, parent)


def _finish(
    cfg: dict,
    spec: SweepSpec,
    rows: list[dict[str, Any]],
    work_dir: Path,
    mlflow: dict[str, Any] | None,
    parent: str | None,
) -> int:
    keys = list(spec.space)
    unfinished = [r for r in rows if r["status"] not in ("TERMINATED", "ERROR")]
    failed = [r for r in rows if r["status"] == "ERROR"]
    parquet = work_dir / results.RESULTS_FILE
    if rows:
        results.write_parquet(rows, parquet)
        print(results.table(rows, keys, spec.metric), flush=True)
    best = rows[0] if rows and rows[0][f"best_{spec.metric}"] is not None else None
    if best is not None:
        path = results.write_best_config(cfg, {k: best[k] for k in keys if k in best}, work_dir)
        print(
            f"drun tune: best {spec.metric} {best[f'best_{spec.metric}']:.4g} (trial "
            f"{best['trial_id']}); {path}; {parquet}",
            flush=True,
        )
    print(f"drun tune: {results.summary_json(rows, spec.metric)}", flush=True)
    if mlflow is not None and parent is not None:
        status = "KILLED" if unfinished else ("FAILED" if failed else "FINISHED")
        mlflow_parent.close_parent(mlflow, parent, rows, keys, spec.metric, status, parquet)
    if unfinished:
        print(
            f"drun tune: interrupted with {len(unfinished)} trial(s) unfinished: "
            f"drun tune ... --work-dir {work_dir} --resume continues the sweep",
            flush=True,
        )
        return INTERRUPTED_EXIT_CODE
    return 1 if failed else 0
