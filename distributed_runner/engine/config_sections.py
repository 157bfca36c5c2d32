"""The engine's rows of the sections table (:mod:`distributed_runner.engine.sections`): for each
config section, the parser of the subsystem that owns it and what the Ray driver does with it.

A new section is one row here (or, for a layer above the engine, one
:func:`~distributed_runner.engine.sections.register_section` call beside its parser). The driver
steps below only call their owners' functions; each also says one line for ``drun check``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distributed_runner.checkpoint.hf.directory import weight_sources_absolute
from distributed_runner.checkpoint.resume_choice import parse_load_from
from distributed_runner.core import registry
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.preemption import parse_preemption
from distributed_runner.core.signatures import check_arguments
from distributed_runner.core.storage import is_remote
from distributed_runner.data.elastic import check_elastic_config
from distributed_runner.data.ray_data import NOT_WITH_TP
from distributed_runner.data.streaming.shards import driver_index, stream_sources_absolute
from distributed_runner.engine.driver_model import check_model_on_meta
from distributed_runner.engine.hook_builder import plan_hooks
from distributed_runner.engine.pipeline_step import refuse_step_guards
from distributed_runner.engine.sections import DriverPlan, Section, Stored, register_section
from distributed_runner.fault_tolerance.options import (
    check_fault_tolerance,
    parse_fault_tolerance,
)
from distributed_runner.health.watchdog import parse_watchdog
from distributed_runner.model.build import check_compile
from distributed_runner.model.sharding import parse_strategy
from distributed_runner.parallel.mesh import MeshShape
from distributed_runner.parallel.pipeline import check_layout, microbatches
from distributed_runner.validation.async_validation import parse_val_mode

STAGES = ("train", "val", "test")


def _strategy_on_driver(plan: DriverPlan) -> None:
    """The mesh fits the workers (one line here, not one per worker); an elastic group cannot
    keep tp/dp_replicate/pp (Ray may start it at a size they do not divide)."""
    strategy = plan.settings.strategy
    beyond = strategy["type"] == "fsdp" and any(
        strategy[key] > 1 for key in ("tp", "dp_replicate", "pp")
    )
    if beyond and isinstance(plan.workers, tuple):
        raise ConfigError(
            "launcher.num_workers",
            "an elastic group (min, max) cannot keep strategy.tp/dp_replicate/pp: Ray may "
            "start it at a size they do not divide; give a fixed number of workers",
        )
    world, replicas = _pipeline_world(plan), plan.settings.fault_tolerance
    where = f" in each of {replicas['replicas']} replica groups" if replicas is not None else ""
    if strategy["type"] == "fsdp" and strategy["pp"] > 1 and world > 1:
        check_layout(strategy, world)
        schedule = f"{strategy['pp_schedule']}, {microbatches(strategy)} micro-batches"
        inside = f", tp={strategy['tp']} inside each" if strategy["tp"] > 1 else ""
        plan.say(
            "mesh", f"pipeline: pp={strategy['pp']} stages over {world} ranks ({schedule}{inside})"
        )
        plan.say("checkpoints", "full: the stages' weights gathered into one file on rank 0")
        return
    if strategy["type"] != "fsdp" or world == 1:
        plan.say("mesh", f"{strategy['type']} over {world} rank(s){where}: the model trains whole")
        plan.say("checkpoints", "one file (.pth), written by rank 0")
        return
    shape = MeshShape.for_world(world, strategy["tp"], strategy["dp_replicate"])
    plan.say("mesh", f"fsdp, mesh {shape.describe()} over {world} ranks{where}")
    plan.say(
        "checkpoints",
        "sharded: every rank writes its own shards (DCP)"
        if strategy["checkpoint"] == "sharded"
        else "full: gathered into one file on rank 0",
    )


def _load_from_on_driver(plan: DriverPlan) -> None:
    """``load_from`` and an HFModel's ``path`` absolute (workers run in another folder)."""
    plan.remote |= weight_sources_absolute(plan.cfg)
    given, strict = plan.settings.load_from
    if given:
        plan.say("load_from", f"{plan.cfg.get('load_from')} (strict={strict})")


def _resume_on_driver(plan: DriverPlan) -> None:
    """``resume=PATH`` (any form: a ``.pth``, a run's or a ``.dcp`` folder, Ray's copy) made
    absolute: the workers run in another folder."""
    resume = plan.cfg.get("resume")
    if isinstance(resume, (str, Path)) and str(resume) and not is_remote(resume):
        plan.cfg["resume"] = str(Path(resume).expanduser().resolve())
        plan.say("resume", plan.cfg["resume"])


def _pipeline_world(plan: DriverPlan) -> int:
    """The ranks one model spans: the world, or a replica group's (fault_tolerance/: each is a
    world of its own)."""
    replicas = plan.settings.fault_tolerance
    return plan.world if replicas is None else int(replicas["ranks_per_replica"])


def _model_on_driver(plan: DriverPlan) -> None:
    """The model's type and arguments resolved, then the model built on the meta device and
    checked as each worker will (the plan, LoRA targets, the files' names and shapes)."""
    _check_spec(registry.MODELS, plan.cfg["model"], "model")
    for line in check_model_on_meta(plan.cfg, plan.settings, _pipeline_world(plan)):
        plan.say("model", line)


def _loader_on_driver(stage: str) -> Any:
    def step(plan: DriverPlan) -> None:
        key = f"{stage}_dataloader"
        loader = plan.cfg.get(key)
        if not isinstance(loader, dict):
            return
        kind = loader.get("type")
        if kind == "RayDataLoader" and plan.settings.strategy.get("tp", 1) > 1:
            raise ConfigError(f"{key}.type", NOT_WITH_TP)
        if kind == "StreamingLoader":
            from distributed_runner.data.loaders import streaming_arguments
            from distributed_runner.data.streaming import StreamingLoader

            args = {k: v for k, v in loader.items() if k != "type"}
            check_arguments(StreamingLoader, args, key)
            _check_spec(
                registry.DATASETS,
                streaming_arguments(args, key)[0].get("dataset"),
                f"{key}.dataset",
            )
            plan.remote |= stream_sources_absolute(loader, key)
            index = driver_index(loader, key)  # every footer read, once, here
            if index is not None:
                path = (key, "dataset", "index")
                plan.stored.append(Stored(f"data_index/{key}.arrow", index, path))
                plan.say("data", f"{key}: {len(index.files)} files indexed for the workers")
        elif kind != "RayDataLoader":
            _check_spec(registry.DATASETS, loader.get("dataset"), f"{key}.dataset")
        if stage == "train":
            check_elastic_config(plan.cfg)  # every size of an elastic group splits the batch
        plan.say("data", _data_line(plan, key, loader))

    step.__doc__ = f"{stage}_dataloader: its dataset resolved, its sources made absolute."
    return step


def _data_line(plan: DriverPlan, key: str, loader: dict) -> str:
    """What each rank reads: its batch, the global batch, the streams of a StreamingLoader."""
    strategy = plan.settings.strategy
    tp = strategy.get("tp", 1) if strategy["type"] == "fsdp" and plan.world > 1 else 1
    groups = max(plan.world // tp, 1)
    replicas = plan.settings.fault_tolerance  # each rank of each replica group reads a share
    ranks = ""
    if replicas is not None:
        per = int(replicas["ranks_per_replica"])
        groups = int(replicas["replicas"]) * per
        ranks = f" x {per} ranks" if per > 1 else ""
    batch = loader.get("batch_size")
    optim = plan.cfg.get("optim_wrapper")
    steps = optim.get("accumulative_counts", 1) if isinstance(optim, dict) else 1
    kind = loader.get("type") or "DataLoader"
    count = f"{replicas['replicas']} replicas{ranks}" if replicas else f"{groups} data-parallel"
    if replicas and key != "train_dataloader":  # dist.whole_data_per_replica
        count = f"the whole set in each replica{ranks}"
    words = f"{key}: {kind}, {count}{'' if replicas else ' rank(s)'}"
    if isinstance(batch, int):
        words += f" x batch {batch}"
        if key == "train_dataloader":
            words += f" x {steps} accumulation = global batch {batch * groups * steps}"
    if kind == "StreamingLoader":
        streams = loader.get("num_streams")
        words += (
            f", {streams} streams split over the ranks"
            if streams is not None
            else ", streams chosen from the data and the worker counts (num_streams)"
        )
    return words


def _evaluators_on_driver(plan: DriverPlan) -> None:
    """Every metric's type resolved and its arguments matched."""
    for stage in STAGES:
        evaluator = plan.cfg.get(f"{stage}_evaluator")
        metrics = evaluator if isinstance(evaluator, list) else [evaluator]
        for i, metric in enumerate(metrics):
            key = f"{stage}_evaluator[{i}]" if isinstance(evaluator, list) else f"{stage}_evaluator"
            _check_spec(registry.METRICS, metric, key)


def _optim_on_driver(plan: DriverPlan) -> None:
    """The optimizer, the paramwise options and the schedulers, resolved without a model."""
    optim = plan.cfg.get("optim_wrapper")
    if isinstance(optim, dict):
        _check_spec(
            registry.OPTIMIZERS,
            optim.get("optimizer"),
            "optim_wrapper.optimizer",
            supplied=("params",),
        )
        if "paramwise_cfg" in optim or "constructor" in optim:
            from distributed_runner.optim.wrapper import constructor_for

            constructor_for(optim)  # checks its options without a model
    schedulers = plan.cfg.get("param_scheduler")
    for i, sched in enumerate(schedulers if isinstance(schedulers, list) else [schedulers]):
        if isinstance(sched, dict) and "type" in sched:
            registry.PARAM_SCHEDULERS.resolve(sched["type"], f"param_scheduler[{i}]")


def _hooks_on_driver(plan: DriverPlan) -> None:
    """The hooks as the launcher runs them, built and checked (their sinks checked, not
    built): the plan ``drun check`` prints."""
    planned = plan_hooks(plan.cfg)
    if plan.settings.strategy.get("pp", 1) > 1 and _pipeline_world(plan) > 1:  # pipeline_step.py
        refuse_step_guards(planned.step_guards)
    plan.say("hooks", ", ".join(entry.name for entry in planned.entries))
    saver = planned.hook_named("checkpoint")
    if saver is not None:
        keep = getattr(saver, "max_keep_ckpts", -1)
        best = getattr(saver, "save_best", None)
        plan.say(
            "checkpoints",
            f"every {getattr(saver, 'interval', '?')} "
            f"{'epoch(s)' if getattr(saver, 'by_epoch', True) else 'iteration(s)'}, "
            f"keeping {'all' if keep < 0 else f'the newest {keep}'}"
            f"{f' and the best by {best}' if best else ''}",
        )


def _fault_tolerance_on_driver(plan: DriverPlan) -> None:
    """What the replicas cannot keep exact, refused before any starts."""
    options = plan.settings.fault_tolerance
    settings = plan.settings
    check_fault_tolerance(plan.cfg, options, settings.launcher, settings.watchdog)
    if options is not None:
        plan.say(
            "fault tolerance",
            f"{options['replicas']} replica groups{_of_ranks(options)}, a step commits with at "
            f"least {options['min_replicas']}; a lost one's share is trained by the others",
        )


def _of_ranks(options: dict) -> str:
    ranks = int(options["ranks_per_replica"])
    return f" of {ranks} ranks (FSDP inside a group, HSDP across)" if ranks > 1 else ""


def _check_spec(reg: Any, spec: Any, key: str, supplied: tuple = ()) -> None:
    """A ``dict(type=...)`` resolves in ``reg`` and its arguments fit the constructor (anything
    else, e.g. an object already built, is left to the worker)."""
    if isinstance(spec, dict):
        if "type" not in spec:
            raise ConfigError(key, "missing 'type'")
        cls = reg.resolve(spec["type"], key)
        check_arguments(cls, {k: v for k, v in spec.items() if k != "type"}, key, supplied=supplied)


# The table, in the order the driver runs the steps (the launcher's row, first, is launch's:
# distributed_runner/launch/launcher_config.py). load_from comes before the model: the model's
# check reads the files load_from names, made absolute.
SECTIONS = [
    Section(
        "strategy",
        "DDP or FSDP and the mesh (tp, dp_replicate): model/sharding.py",
        parse_strategy,
        _strategy_on_driver,
    ),
    Section(
        "watchdog", "the hang watch and straggler detection: health/watchdog.py", parse_watchdog
    ),
    Section("val_cfg", "where validation runs (mode, lag, resources)", parse_val_mode),
    Section("compile", "torch.compile's arguments (model/build.py)", check_compile, optional=True),
    Section(
        "preemption",
        "signals that save a checkpoint and stop",
        parse_preemption,
        default=True,  # the Runner's: SIGTERM checkpoints and stops unless preemption=False
    ),
    Section(
        "load_from",
        "weights to start from: a checkpoint or a model directory",
        parse_load_from,
        _load_from_on_driver,
    ),
    Section("resume", "continue a run: True, or a checkpoint in any form", None, _resume_on_driver),
    Section("model", "the model, built on the meta device by the driver", None, _model_on_driver),
    *(
        Section(f"{stage}_dataloader", f"the {stage} data", None, _loader_on_driver(stage))
        for stage in STAGES
    ),
    Section("evaluators", "val_evaluator, test_evaluator", None, _evaluators_on_driver),
    Section("optim_wrapper", "the optimizer and its schedules", None, _optim_on_driver),
    Section("hooks", "default_hooks and custom_hooks, planned", None, _hooks_on_driver),
    Section(
        "fault_tolerance",
        "replica groups that survive a lost replica (fault_tolerance/)",
        parse_fault_tolerance,
        _fault_tolerance_on_driver,
    ),
]
for _row in SECTIONS:
    register_section(_row)
