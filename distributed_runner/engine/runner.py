"""The Runner: builds everything from a config, owns the run's services, runs the loops.

The same object runs in a plain process and in each Ray Train worker: rank and world size come
from :mod:`distributed_runner.core.dist` only. ``work_dir`` is the run's own folder, absolute: the
config's ``work_dir`` holds runs, a folder each (``run_name``, a timestamp by default;
:mod:`distributed_runner.core.run_folders`), so everything a hook writes there stays its run's. Each
Runner has its own MessageHub, sinks, requests and hook tables; the Python logger
(:mod:`distributed_runner.core.log`) is one per process, re-pointed at this Runner's ``work_dir``
and rank when it is built. It owns, each in one place: the position (:class:`TrainState`,
``train_state``; ``epoch``/``iter``/``max_epochs``/``max_iters``/``by_epoch`` read it), the log
sinks (:class:`SinkSet`, ``sinks``: built here, opened around every ``train()/val()/test()``)
and the hooks with their declared extension points
(:mod:`distributed_runner.engine.extension_points`).

Hooks use the public surface: ``model``, ``wrapped_model`` (what the loops call; PrepareTTAHook
swaps it), ``optim_wrapper``, ``param_schedulers``, the dataloaders, the position, ``work_dir``,
``val_mode`` (val_cfg's mode, lag and resources:
:mod:`distributed_runner.validation.async_validation`), ``cfg``, ``message_hub``, ``logger``,
``sinks``, ``rank``, ``world_size``, ``train_loop``, ``strategy`` (DDP or FSDP's options),
``mesh_shape`` (FSDP's ``(dp_replicate, dp_shard, tp)`` on several ranks, else None),
``elastic_plan`` (an elastic run's split of the global batch,
:mod:`distributed_runner.data.elastic`), ``save_checkpoint()``, ``checkpoints`` (its writer:
``wait()`` for a background save), ``load_checkpoint()``, ``loading_for`` (while
after_load_checkpoint runs: 'resume' or 'load_from'),
``request_stop/request_checkpoint/request_val`` (:mod:`distributed_runner.engine.requests`),
``hook_timings()``. Mount point order: :mod:`.loops`.
"""

from __future__ import annotations

import time
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from distributed_runner.checkpoint.files import load_file, point_at, read_pointer
from distributed_runner.checkpoint.hf.directory import is_pretrained_dir, pretrained_source
from distributed_runner.checkpoint.hf.load import PretrainedWeights
from distributed_runner.checkpoint.resume_choice import (
    checkpoint_file_of,
    choose_run,
    choose_start,
    meta_to_resume,
    newest_everywhere,
    require_training_checkpoint,
    resume_path,
)
from distributed_runner.checkpoint.state import load_model_weights, restore_training_state
from distributed_runner.checkpoint.types import CheckpointSubject
from distributed_runner.checkpoint.writer import CheckpointWriter
from distributed_runner.core import dist
from distributed_runner.core.config import Config
from distributed_runner.core.config_values import all_or_none
from distributed_runner.core.env_cfg import apply_env_cfg
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.log import log_brief_and_full, run_log_file, setup_logger
from distributed_runner.core.preemption import preemption_signals
from distributed_runner.core.randomness import set_random_seed, with_resumed_seed
from distributed_runner.core.redact import redact
from distributed_runner.core.registry import LOOPS
from distributed_runner.core.run_folders import run_dir, run_name_of
from distributed_runner.core.signatures import check_arguments
from distributed_runner.data.elastic import GlobalBatchPlan, elastic_training
from distributed_runner.data.loaders import build_dataloader, seeded_dataloader
from distributed_runner.data.world_change import (
    confirm_global_batch,
    iteration_samples,
    stream_count,
)
from distributed_runner.engine.config_prep import RUNNER_KEYS, prepare_config
from distributed_runner.engine.hook_builder import build_dispatcher
from distributed_runner.engine.hook_report import plan_summary
from distributed_runner.engine.loops import TestLoop, ValLoop
from distributed_runner.engine.message_hub import MessageHub
from distributed_runner.engine.replica_step import in_quorum
from distributed_runner.engine.requests import ControlRequests
from distributed_runner.engine.sections import Settings, parse_sections, settings_of
from distributed_runner.engine.step_choice import trains_itself
from distributed_runner.engine.train_state import TrainState
from distributed_runner.evaluation.evaluator import Evaluator
from distributed_runner.fault_tolerance.events import ReplicaEvent
from distributed_runner.fault_tolerance.replica import replica_group
from distributed_runner.health.watchdog import watched
from distributed_runner.model.build import default_device, setup_model
from distributed_runner.model.sharding import mesh_shape
from distributed_runner.optim.schedulers import build_param_schedulers
from distributed_runner.optim.wrapper import OptimWrapper, build_optim_wrapper
from distributed_runner.tracking.sinks import SinkSet
from distributed_runner.validation.async_validation import val_loop_args
from distributed_runner.version import __version__

if TYPE_CHECKING:
    from distributed_runner.engine.dispatch import HookDispatcher


def agreed_run_dir(work_dir: str | Path, run_name: str | None, resume: Any) -> Path:
    """The run's folder under ``work_dir``, the same on every rank: ``run_name`` if the config
    names one (a Ray driver always does), else rank 0's choice (:func:`choose_run`: a new
    timestamp, or the run ``resume`` continues), broadcast."""
    work_dir = Path(work_dir).expanduser().resolve()
    if run_name is not None:  # checked on every rank, no choice to agree on
        return run_dir(work_dir, choose_run(work_dir, run_name, resume))
    chosen = choose_run(work_dir, None, resume) if dist.get_rank() == 0 else ""
    return run_dir(work_dir, dist.broadcast_object(chosen))


def arguments_parsed(cfg: dict | None, **sections: Any) -> Settings:
    """The settings of a Runner built in Python (its config not prepared by ``from_cfg``): its
    arguments' sections, and the config's ``watchdog``, parsed by the sections table."""
    return parse_sections({**sections, "watchdog": (cfg or {}).get("watchdog")})


class RunnerSurface:
    """The forwarding part of the Runner's public surface (the module docstring lists it all):
    what hooks read and call on the Runner to reach its hooks, its position and its requests,
    apart from the Runner's construction, entry points and checkpoints.

    It forwards to the model and the training loop (``model``, ``train_dataloader``), to the
    dispatcher (``_hooks``: the hook tables, their timings and the loops' callers), to the training
    position (``_state``, the one :class:`TrainState`) and to the control requests
    (``requests``). The Runner inherits it and sets those attributes.
    """

    _hooks: HookDispatcher
    _model: nn.Module
    requests: ControlRequests
    train_loop: Any
    val_loop: Any

    @property
    def model(self) -> nn.Module:
        """The unwrapped model (never the DDP wrapper)."""
        return self._model

    @property
    def train_dataloader(self) -> Any:
        """The loader training iterates; assigning one replaces it there (MMEngine's property)."""
        return self.train_loop.dataloader if self.train_loop is not None else None

    @train_dataloader.setter
    def train_dataloader(self, loader: Any) -> None:
        if self.train_loop is None:
            raise ConfigError(
                "train_dataloader",
                "this Runner does not train: it needs "
                "train_dataloader, train_cfg and optim_wrapper",
            )
        self.train_loop.dataloader = loader

    @property
    def hooks(self) -> list:
        return [e.hook for e in self._hooks.entries]

    # the position, read from the one TrainState (all zeros, by_epoch True, when nothing trains);
    # attrgetter properties: hooks read these several times per iteration, and a getter written
    # in Python would cost a call each time
    train_state = property(attrgetter("_state"), doc="Where training is (TrainState).")
    epoch = property(attrgetter("_state.epoch"))
    iter = property(attrgetter("_state.iter"))
    max_epochs = property(attrgetter("_state.max_epochs"))
    max_iters = property(attrgetter("_state.max_iters"))
    by_epoch = property(
        attrgetter("_state.by_epoch"),
        doc="Whether training is epoch-based (True also when nothing trains).",
    )

    @property
    def mount_callers(self) -> dict:
        """Mount point -> the function that calls it (``caller(**kwargs)``), kept current as
        hooks are disabled: what the loops call on their hot path."""
        return self._hooks.callers

    @property
    def call_hook(self):
        """``call_hook(mount, **kwargs)``: run mount point ``mount`` on every hook that implements
        it, in call order. (The dispatcher's bound method itself: the loops call it several times
        per iteration.)"""
        return self._hooks.call

    step_guards = property(
        attrgetter("_hooks.step_guards"),
        doc="The StepGuard hooks (engine.extension_points), in call order.",
    )

    def hook_bracket(self, before: str, after: str):
        """Context manager: ``before`` now, ``after`` at exit — also when the body raises."""
        return self._hooks.bracket(before, after)

    def hook_plan(self) -> str:
        return self._hooks.plan_text()

    def stateful_hooks(self) -> dict[str, Any]:
        """Registered name -> hook, for the hooks whose state a checkpoint keeps."""
        return {
            e.name: e.hook
            for e in self._hooks.entries
            if callable(getattr(e.hook, "state_dict", None))
        }

    def val_metric_names(self) -> list[str] | None:
        """The keys validation will report, if its metrics declare them (else None): hooks that
        name a metric (``save_best``, ``monitor``) check it before training starts."""
        if self.val_loop is None or not hasattr(self.val_loop.evaluator, "metric_names"):
            return None
        return self.val_loop.evaluator.metric_names()

    def get_hook(self, name: str) -> Any:
        """The hook registered under ``name`` (e.g. ``'checkpoint'``), or None."""
        return self._hooks.hook_named(name)

    def hook_timings(self) -> list:
        """Cumulative time per (hook, mount point), slowest first
        (:class:`~distributed_runner.engine.hook_report.HookTiming` rows)."""
        return self._hooks.timings()

    def hook_seconds(self) -> dict[str, float]:
        """Cumulative time per registered hook name, over all its mount points."""
        return self._hooks.seconds_by_hook()

    # -- requests (hooks request, the loop acts; see distributed_runner.engine.requests) -------
    def request_stop(self, reason: str) -> None:
        """End training after the current iteration (or validation), on every rank."""
        self.requests.request("stop", reason)

    def request_checkpoint(self, reason: str) -> None:
        """Save a checkpoint after the current iteration, on every rank."""
        self.requests.request("checkpoint", reason)

    def request_val(self, reason: str) -> None:
        """Run validation after the current iteration, on every rank."""
        self.requests.request("val", reason)

    def request_pause(self, reason: str) -> None:
        """Save a checkpoint after the current iteration and end the run unfinished, on every
        rank, as a preemption signal does (``train()`` raises TrainingPreempted)."""
        self.requests.request("preempt", reason)


class Runner(RunnerSurface):
    """Train, validate and test a model with hooks; see the module docstring. A config's
    top-level keys are the constructor's arguments (``Runner.from_cfg``).

    Args:
        model (nn.Module | dict): the model, or ``dict(type=...)`` built from MODELS.
        work_dir (str | Path): the folder of this config's runs; each run writes its logs
            and checkpoints in a folder of its own under it (``run_name``).
        run_name (str | None): the run's folder under work_dir: a new timestamp by default
            (``--resume``: the newest run that has a checkpoint); '.' is work_dir itself.
        train_dataloader (dict | DataLoader | None): the training data: ``dict(dataset=...,
            batch_size=..., sampler=...)``, a StreamingLoader or RayDataLoader, or a DataLoader.
        val_dataloader (dict | DataLoader | None): the validation data, as train_dataloader.
        val_evaluator (dict | list | None): the metric(s) validation computes.
        val_cfg (dict | None): how validation runs (``mode='inline'`` or ``'async'``).
        test_dataloader (dict | DataLoader | None): the data ``drun test`` evaluates.
        test_evaluator (dict | list | None): the metric(s) of ``drun test``.
        test_cfg (dict | None): how testing runs (``dict()``).
        optim_wrapper (dict | OptimWrapper | None): the optimizer and its options
            (accumulation, clipping, AMP).
        param_scheduler (dict | list | None): learning-rate (and momentum) schedules.
        train_cfg (dict | None): how long to train and when to validate.
        default_hooks (dict | None): the built-in hooks by name, changed or removed (None).
        custom_hooks (list | None): more hooks, ``dict(type=...)`` or objects.
        load_from (str | dict | None): weights to start from (not the run's position): a
            checkpoint, or a Hugging Face model directory (checkpoint/hf/load.py);
            ``dict(path=..., strict=False)`` when the files and the model differ on purpose.
        resume (bool | str): continue a run: True takes the newest verified checkpoint of
            the newest run under work_dir that has one, a path that checkpoint.
        randomness (dict | None): the seed and determinism (``dict(seed=0)``).
        launcher (str | dict): 'none' (this process) or Ray (``dict(type='ray', ...)``).
        device (str | torch.device | None): where to train; None picks CUDA when present.
        log_level (str): the run log's level (DEBUG, INFO, WARNING, ERROR).
        experiment_name (str | None): the name runs share in logs and MLflow (its
            experiment); default work_dir's name.
        model_wrapper_cfg (dict | None): DDP's arguments when several ranks run.
        preemption (bool | dict): SIGTERM handling (checkpoint and exit); False turns it off.
        compile (bool | dict): ``torch.compile`` the model (True, or its arguments).
        strategy (str | dict | None): 'ddp' or FSDP (``dict(type='fsdp', ...)``).
        cfg (dict | None): the whole config, kept for checkpoints and sinks.
    """

    def __init__(
        self,
        model: nn.Module | dict,
        work_dir: str | Path,
        train_dataloader: dict | DataLoader | None = None,
        val_dataloader: dict | DataLoader | None = None,
        val_evaluator: dict | list | None = None,
        val_cfg: dict | None = None,
        test_dataloader: dict | DataLoader | None = None,
        test_evaluator: dict | list | None = None,
        test_cfg: dict | None = None,
        optim_wrapper: dict | OptimWrapper | None = None,
        param_scheduler: dict | list | None = None,
        train_cfg: dict | None = None,
        default_hooks: dict | None = None,
        custom_hooks: list | None = None,
        load_from: str | dict | None = None,
        resume: bool | str = False,
        randomness: dict | None = None,
        launcher: str | dict = "none",
        device: str | torch.device | None = None,
        log_level: str = "INFO",
        experiment_name: str | None = None,
        model_wrapper_cfg: dict | None = None,
        preemption: bool | dict = True,
        compile: bool | dict = False,
        strategy: str | dict | None = None,
        run_name: str | None = None,
        cfg: dict | None = None,
    ) -> None:
        # the parsed sections (engine/sections.py): from_cfg's, or parsed here from the arguments
        self.settings: Settings = settings_of(cfg) or arguments_parsed(
            cfg, strategy=strategy, preemption=preemption, load_from=load_from, val_cfg=val_cfg,
            compile=compile, launcher=launcher,
        )  # fmt: skip
        folder = agreed_run_dir(work_dir, run_name, resume)
        self.run_name = run_name_of(work_dir, folder)
        experiment_name = experiment_name or Path(work_dir).expanduser().resolve().name
        self._setup_context(cfg, launcher, folder, experiment_name, log_level)
        # hooks and checkpoint paths first: their mistakes should not wait for data to load
        self._setup_hooks_and_checkpoints(default_hooks, custom_hooks, resume)
        self._setup_model(model, randomness, device, model_wrapper_cfg)
        self._setup_data_and_evaluation(
            train_dataloader,
            train_cfg,
            optim_wrapper,
            param_scheduler,
            val_dataloader,
            val_evaluator,
            val_cfg,
            test_dataloader,
            test_evaluator,
            test_cfg,
        )
        self._log_startup()

    def _setup_context(
        self,
        cfg: dict | None,
        launcher: Any,
        work_dir: str | Path,
        experiment_name: str,
        log_level: str,
    ) -> None:
        """Config, ranks, the run's folder (``self.work_dir``), logger and run services: what
        everything after them uses."""
        self.cfg = cfg if cfg is not None else Config()
        self.launcher = launcher
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.work_dir = Path(work_dir).expanduser().resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.timestamp = time.strftime("%Y%m%d_%H%M%S")
        self.experiment_name = experiment_name
        self.logger = setup_logger(self.work_dir, self.rank, log_level)
        # fault_tolerance: this process is one replica slot of the global batch (fault_tolerance/)
        self.replicas = replica_group(self.settings.fault_tolerance, self.logger)
        self.message_hub = MessageHub()
        self.requests = ControlRequests()
        self._preemption = self.settings.preemption

    def _setup_hooks_and_checkpoints(
        self,
        default_hooks: dict | None,
        custom_hooks: list | None,
        resume: bool | str,
    ) -> None:
        """Hooks, sinks and checkpoint paths: built and checked before the model and data."""
        self._hooks = build_dispatcher(self, default_hooks, custom_hooks)
        # the sinks the hooks name (SinkProvider): validated on every rank, built on rank 0 (of
        # replica 0 in a fault-tolerant run: the run is tracked once)
        self.sinks = SinkSet.build(
            self._hooks.sink_specs(), build=self.rank == 0 and dist.get_data_parallel_rank() == 0
        )
        self._load_from, self._load_strict = self.settings.load_from
        # a Hugging Face directory (absolute, or its URI) fills the model as it is built
        self.pretrained_from = pretrained_source(self._load_from)
        if self._load_from and not self.pretrained_from:  # any form of a checkpoint: its file
            self._load_from = str(checkpoint_file_of(self._load_from, "load_from", model_dir=True))
        # --resume PATH in any form: the checkpoint file it names (a path naming none, a URI
        # among them, is one line there, as a load_from that is neither checkpoint nor directory)
        self._resume = resume_path(resume)
        self.checkpoints = CheckpointWriter(self)  # save_checkpoint's writer (sync or async)
        self._has_loaded = False
        self.loading_for: str | None = None  # see _after_load

    def _setup_model(
        self,
        model: nn.Module | dict,
        randomness: dict | None,
        device: str | torch.device | None,
        model_wrapper_cfg: dict | None,
    ) -> None:
        """Seed, device, strategy and the (wrapped) model: seeded before its weights are made."""
        self.num_threads = apply_env_cfg(self.cfg.get("env_cfg"))  # before any tensor math
        self.strategy = self.settings.strategy  # 'ddp' or FSDP's options (model/sharding.py)
        self.mesh_shape = mesh_shape(self.strategy)  # None: the model is not split
        # ranks of one tensor-parallel group read the same data (core/dist.py)
        shape = self.mesh_shape
        pipelined = self.strategy.get("pp", 1) > 1 and dist.is_distributed()
        if shape is not None:
            dist.set_rank_layout(shape.tp, shape.dp_replicate)
        elif pipelined:  # the mesh inside each stage (parallel/pipeline.py)
            dist.set_rank_layout(self.strategy["tp"], self.strategy["dp_replicate"])
        else:
            dist.set_rank_layout(1)
        dist.set_pipeline_layout(self.strategy["pp"] if pipelined else 1)
        if shape is None and self._beyond_fsdp():
            self.logger.info(
                "strategy: tp=%s, dp_replicate=%s, pp=%s apply across ranks; with one process "
                "the model trains whole",
                self.strategy["tp"],
                self.strategy["dp_replicate"],
                self.strategy["pp"],
            )
        # a resume keeps its seed, and its global batch at another world size (data/world_change)
        self._resumed = meta_to_resume(self._resume, self.work_dir)
        seed = self._resumed.get("seed")
        resumed_seed = int(seed) if seed is not None else None
        self.seed = set_random_seed(with_resumed_seed(randomness, resumed_seed, self.logger))
        self.device = torch.device(device) if device is not None else default_device()
        weights = (
            PretrainedWeights(self.pretrained_from, self._load_strict, self.seed, self.logger)
            if self.pretrained_from
            else None
        )  # a Hugging Face directory fills the model as it is built (checkpoint/hf/load.py)
        built = setup_model(
            model, model_wrapper_cfg, self.settings.compile, self.device, self.strategy, weights
        )
        self._model, self.wrapped_model = built.model, built.wrapped
        self.pipeline = built.pipeline  # this rank's part of the pipeline (strategy.pp), or None

    def _setup_data_and_evaluation(
        self,
        train_dataloader: Any,
        train_cfg: dict | None,
        optim_wrapper: Any,
        param_scheduler: Any,
        val_dataloader: Any,
        val_evaluator: Any,
        val_cfg: dict | None,
        test_dataloader: Any,
        test_evaluator: Any,
        test_cfg: dict | None,
    ) -> None:
        """Training (loader, loop, optimizer, schedulers), then the val and test loops."""
        self.val_dataloader = self.test_dataloader = None
        self.train_loop: Any = None  # a LOOPS class's loop (EpochBasedTrainLoop by default)
        self.elastic_plan: GlobalBatchPlan | None = None
        self.global_batch: int | None = None  # samples an iteration trains, all ranks together
        self.num_streams: int | None = None  # a StreamingLoader's streams (its order's C)
        self.train_batch_size: int | None = None  # train_dataloader.batch_size as configured
        self._state = TrainState()  # the training loop's own once it is built
        self.optim_wrapper: OptimWrapper | None = None
        self.param_schedulers: list = []
        self._build_training(train_dataloader, train_cfg, optim_wrapper, param_scheduler)
        self.val_mode = self.settings.val_cfg  # mode/lag/resources: validation/
        val_cfg = val_loop_args(val_cfg)
        self.val_loop = self._build_eval("val", val_dataloader, val_evaluator, val_cfg, ValLoop)
        self.test_loop = self._build_eval(
            "test", test_dataloader, test_evaluator, test_cfg, TestLoop
        )

    def _log_startup(self) -> None:
        """The run's one-line summary and its hook plan, once everything is built."""
        self.logger.info(
            "distributed-runner %s | torch %s | device %s (%d threads) | world size %d%s%s | "
            "seed %d | run %s in %s",
            __version__,
            torch.__version__,
            self.device,
            self.num_threads,
            self.world_size,
            f" ({self.elastic_plan.describe()})" if self.elastic_plan else "",
            self._mesh_words(),
            self.seed,
            self.run_name,
            self.work_dir,
        )
        # the whole hook plan to the log file, a short one to the terminal (core/log.py)
        plan = plan_summary(
            self._hooks.entries, self._hooks.sink_specs(), run_log_file(self.logger)
        )
        log_brief_and_full(self.logger, plan, self._hooks.plan_text())

    def _beyond_fsdp(self) -> bool:
        """Whether the strategy asks for more than FSDP's one dimension (TP, HSDP or PP)."""
        return any(self.strategy.get(key, 1) > 1 for key in ("tp", "dp_replicate", "pp"))

    def _mesh_words(self) -> str:
        """`` (mesh dp_replicate=1 x dp_shard=2 x tp=2)`` for the startup line, when the mesh
        has more than FSDP's one dimension."""
        if self.mesh_shape is None or not self._beyond_fsdp():
            return ""
        return f" (mesh {self.mesh_shape.describe()})"

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_cfg(cls, cfg: dict) -> Runner:
        """A Runner from a config (a :class:`Config` or a plain dict, as on a Ray worker).

        The config is prepared by the same function the Ray driver checks it with
        (:func:`prepare_config`): a worker applies no rule the driver did not, the device aside."""
        cfg, notes = prepare_config(cfg)  # iMIX notes: logged once the Runner's logger exists
        # (a config prepared already, as on a Ray worker, is not prepared again)
        runner = cls(**{k: cfg[k] for k in RUNNER_KEYS if k in cfg}, cfg=cfg)
        for note in notes:
            runner.logger.info(note)
        if runner.rank == 0:
            (runner.work_dir / "config.py").write_text(Config(redact(cfg)).pretty_text())
        return runner

    def _build_training(
        self, dataloader: Any, train_cfg: dict | None, optim_wrapper: Any, param_scheduler: Any
    ) -> None:
        if not all_or_none(
            "training",
            {
                "train_dataloader": dataloader,
                "train_cfg": train_cfg,
                "optim_wrapper": optim_wrapper,
            },
        ):
            if param_scheduler is not None:
                raise ConfigError(
                    "param_scheduler",
                    "set without training: add train_dataloader, train_cfg and optim_wrapper",
                )
            return
        world = dist.get_data_parallel_world_size()  # tp stays; the replicas vary
        built = build_dataloader(dataloader, "train_dataloader", self.seed)
        size = getattr(built, "batch_size", None)  # a checkpoint records it (world_change.py)
        self.train_batch_size = size if isinstance(size, int) else None
        loader, optim_wrapper, self.elastic_plan = elastic_training(  # data/elastic.py, else as is
            built,
            optim_wrapper,
            self.launcher,
            world,
            dist.get_data_parallel_rank(),
            self._resumed,  # a resume at another world size keeps the global batch
            self.logger,
            trains_itself=trains_itself(self._model),
        )
        self.global_batch = iteration_samples(loader, self.elastic_plan, world)
        self.num_streams = stream_count(loader)  # a resume keeps a streamed run's order
        self.train_loop = self._build_train_loop(dict(train_cfg or {}), loader)
        self._state = self.train_loop.state
        self.optim_wrapper = build_optim_wrapper(optim_wrapper, self._model)
        state = self.train_state
        self.param_schedulers = build_param_schedulers(
            param_scheduler,
            self.optim_wrapper.optimizer,
            by_epoch_training=state.by_epoch,
            epoch_length=len(loader),
            max_epochs=state.max_epochs if state.by_epoch else None,
            max_iters=state.max_iters,
        )

    def _build_train_loop(self, train_cfg: dict, loader: Any) -> Any:
        if "type" in train_cfg:
            loop_cls = LOOPS.resolve(train_cfg.pop("type"), "train_cfg")
        else:
            by_epoch = train_cfg.pop("by_epoch", True)
            loop_cls = LOOPS.get("EpochBasedTrainLoop" if by_epoch else "IterBasedTrainLoop")
        check_arguments(loop_cls, train_cfg, "train_cfg", supplied=["runner", "dataloader"])
        return loop_cls(runner=self, dataloader=loader, **train_cfg)

    def _build_eval(
        self, stage: str, dataloader: Any, evaluator: Any, loop_cfg: dict | None, default_loop: type
    ) -> Any:
        if not all_or_none(
            stage,
            {
                f"{stage}_dataloader": dataloader,
                f"{stage}_evaluator": evaluator,
                f"{stage}_cfg": loop_cfg,
            },
            f" (e.g. {stage}_cfg=dict())",
        ):
            return None
        with dist.whole_data_per_replica():  # a fault-tolerant replica evaluates all of it
            loader = build_dataloader(dataloader, f"{stage}_dataloader", self.seed)
        setattr(self, f"{stage}_dataloader", loader)
        loop_args = dict(loop_cfg or {})
        loop_cls = (
            LOOPS.resolve(loop_args.pop("type"), f"{stage}_cfg")
            if "type" in loop_args
            else default_loop
        )
        check_arguments(
            loop_cls, loop_args, f"{stage}_cfg", supplied=["runner", "dataloader", "evaluator"]
        )
        return loop_cls(
            runner=self,
            dataloader=loader,
            evaluator=Evaluator.build(evaluator, f"{stage}_evaluator"),
            **loop_args,
        )

    # -- the public surface hooks use ----------------------------------------------------------
    build_dataloader = staticmethod(seeded_dataloader)  # MMEngine's Runner.build_dataloader

    def save_requested_checkpoint(self, reason: str) -> Path:
        """Save a checkpoint for a request: through the first
        :class:`~distributed_runner.engine.extension_points.CheckpointSaver` (CheckpointHook), so
        retention and the ``last_checkpoint`` pointer stay right; else ``work_dir/iter_{N}.pth``
        directly."""
        saver = self._hooks.checkpoint_saver()
        if saver is not None:
            return saver.save_on_request(self, reason)
        path = self.save_checkpoint(self.work_dir, f"iter_{self.iter}.pth")
        if self.rank == 0:
            point_at(path, self.work_dir)
        return path

    def rollback(self, reason: str) -> Path:
        """Restore the newest checkpoint on every rank (rank 0 reads it and sends it, so ranks on
        other machines need not see ``work_dir``). Used by NonFiniteLossHook(policy='rollback')."""
        self.checkpoints.wait()  # the newest checkpoint may still be being written
        ckpt, path = newest_everywhere(self.work_dir, self.logger, self.rank, reason)
        self.logger.warning("rolling back to %s: %s", path, reason)
        self._restore(ckpt, path)
        if self.optim_wrapper is not None:  # None only in a Runner that does not train
            self.optim_wrapper.initialize_count_status(self.iter, self.max_iters)
        return Path(path)

    # -- entry points --------------------------------------------------------------------------
    def train(self) -> nn.Module:
        if self.train_loop is None or self.optim_wrapper is None:  # both or neither
            raise ConfigError(
                "train_dataloader",
                "train() needs train_dataloader, train_cfg and optim_wrapper in the config",
            )
        with (
            watched(self),  # the hang watch (health/watchdog.py)
            preemption_signals(self._preemption, self.requests, self.logger),
            self.sinks.opened(self),
            self.hook_bracket("before_run", "after_run"),
        ):
            self._load_or_resume()
            with in_quorum(self):  # fault_tolerance: a replica behind the quorum heals here
                self.optim_wrapper.initialize_count_status(self.iter, self.max_iters)
                self.train_loop.run()
                self.checkpoints.wait()  # an asynchronous save still in flight commits now
        return self.model

    def replica_event(self, event: ReplicaEvent) -> None:
        """A change of a fault-tolerant run's quorum (fault_tolerance/): logged and given to
        the hooks' ``after_replica_change``."""
        self.logger.warning("%s", event.describe())
        self.call_hook("after_replica_change", event=event)

    def val(self) -> dict:
        return self._evaluate("val")

    def test(self) -> dict:
        return self._evaluate("test")

    def _evaluate(self, stage: str) -> dict:
        loop = getattr(self, f"{stage}_loop")
        if loop is None:
            raise ConfigError(
                f"{stage}_dataloader",
                f"{stage}() needs {stage}_dataloader, {stage}_evaluator and {stage}_cfg",
            )
        with self.sinks.opened(self), self.hook_bracket("before_run", "after_run"):
            self._load_or_resume()
            metrics = loop.run()
        return metrics

    # -- checkpoints ---------------------------------------------------------------------------
    def find_latest_checkpoint(self) -> Path | None:
        """The checkpoint ``work_dir/last_checkpoint`` points at, if any."""
        return read_pointer(self.work_dir)

    def _load_or_resume(self) -> None:
        if not self._has_loaded:
            self._has_loaded = True
            how, path, ckpt = choose_start(
                self._load_from, self._resume, self.work_dir, self.logger
            )  # checkpoint/resume_choice.py decides
            if path is None:  # a fresh start
                return
            if how == "resume":
                self.resume(path, ckpt)
            elif how == "load_from" and not self.pretrained_from:  # a directory was loaded
                self.load_checkpoint(path, strict=self._load_strict)  # as the model was built

    def load_checkpoint(
        self, path: str | Path, strict: bool = True, map_location: Any = "cpu"
    ) -> dict:
        """Load model weights only (``load_from``); returns the checkpoint dict."""
        if is_pretrained_dir(path):
            raise ConfigError(
                "load_from",
                f"{path} is a model directory, which fills the model as it is built: "
                f"set load_from={str(path)!r} in the config instead",
            )
        ckpt = load_file(path, "load_from", map_location)
        self._after_load(ckpt, "load_from")
        load_model_weights(CheckpointSubject.of(self), ckpt, path, "load_from", strict=strict)
        self.logger.info("loaded weights from %s", path)
        return ckpt

    def resume(self, path: str | Path, checkpoint: dict | None = None) -> dict:
        """Restore the full training state of ``path`` (``checkpoint``: the file, already read
        and verified) and continue exactly where it stopped."""
        ckpt = load_file(path, "resume") if checkpoint is None else checkpoint
        require_training_checkpoint(ckpt, path)
        confirm_global_batch(ckpt["meta"], self._resumed, path)  # what the loader was cut for
        self._restore(ckpt, path)
        meta = ckpt["meta"]
        self.logger.info(
            "resumed from %s (epoch %s, iter %s)", path, meta.get("epoch"), meta.get("iter")
        )
        return ckpt

    def _restore(self, ckpt: dict, path: str | Path) -> None:
        self._after_load(ckpt, "resume")
        restore_training_state(CheckpointSubject.of(self), ckpt, path)

    def _after_load(self, ckpt: dict, purpose: str) -> None:
        """``after_load_checkpoint`` before anything is taken from ``ckpt`` (MMEngine's order:
        hooks may rewrite it); ``loading_for`` says for what ('resume': the whole training state,
        also a rollback; 'load_from': weights) while the hooks run."""
        self.loading_for = purpose
        try:
            self.call_hook("after_load_checkpoint", checkpoint=ckpt)
        finally:
            self.loading_for = None

    def save_checkpoint(
        self,
        out_dir: str | Path,
        filename: str,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        meta: dict | None = None,
        asynchronous: bool = False,
    ) -> Path:
        """Assemble the checkpoint (the parts :data:`~distributed_runner.checkpoint.parts.PARTS`
        declares) on every rank; rank 0 writes it atomically (with sharded FSDP checkpoints every
        rank writes its shards); ``asynchronous`` writes in the background. Call it on every
        rank; see :mod:`distributed_runner.checkpoint.writer`."""
        return self.checkpoints.save(
            Path(out_dir) / filename, save_optimizer, save_param_scheduler, meta, asynchronous
        )
