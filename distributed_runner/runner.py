"""The Runner: builds everything from a config, owns the run's services, runs the loops.

The same object runs in a plain process and in each Ray Train worker: rank and world size come
from :mod:`distributed_runner.dist` only; ``work_dir`` is made absolute at construction. Each
Runner has its own MessageHub, sinks, requests and hook tables; the Python logger
(:mod:`distributed_runner.log`) is one per process, re-pointed at this Runner's ``work_dir`` and
rank when it is built. It owns, each in one place: the position (:class:`TrainState`,
``train_state``; ``epoch``/``iter``/``max_epochs``/``max_iters``/``by_epoch`` read it), the log
sinks (:class:`SinkSet`, ``sinks``: built here, opened around every ``train()/val()/test()``)
and the hooks with their declared extension points (:mod:`hooks.extension_points`).

Hooks use the public surface: ``model``, ``wrapped_model`` (what the loops call; PrepareTTAHook
swaps it), ``optim_wrapper``, ``param_schedulers``, the dataloaders, the position, ``work_dir``,
``val_mode`` (val_cfg's mode, lag and resources: :mod:`distributed_runner.async_val_config`),
``cfg``, ``message_hub``, ``logger``, ``sinks``, ``rank``, ``world_size``, ``train_loop``,
``strategy`` (DDP or FSDP's options), ``elastic_plan`` (an elastic run's split of the global batch,
:mod:`distributed_runner.elastic`), ``save_checkpoint()``, ``checkpoints`` (its writer: ``wait()``
for a background save), ``load_checkpoint()``, ``loading_for`` (while after_load_checkpoint
runs: 'resume' or 'load_from'), ``request_stop/request_checkpoint/request_val``
(:mod:`distributed_runner.control`), ``hook_timings()``. Mount point order: :mod:`.loops`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import dist
from .async_val_config import split_val_cfg
from .checkpoint import load_file, point_at, read_pointer
from .checkpoint_state import load_model_weights, restore_training_state
from .checkpoint_types import CheckpointSubject
from .checkpoint_writer import CheckpointWriter
from .config import Config
from .config_check import all_or_none
from .config_prep import RUNNER_KEYS, prepare_config
from .control import ControlRequests
from .data import build_dataloader, seeded_dataloader
from .elastic import GlobalBatchPlan, elastic_training
from .errors import ConfigError
from .evaluator import Evaluator
from .hook_builder import build_dispatcher
from .hook_report import plan_summary
from .log import setup_logger
from .loops import TestLoop, ValLoop
from .message_hub import MessageHub
from .model_setup import default_device, setup_model
from .optim import OptimWrapper, build_optim_wrapper
from .preemption import parse_preemption, preemption_signals
from .quiet_log import log_brief_and_full, run_log_file
from .randomness import set_random_seed
from .redact import redact
from .registry import LOOPS
from .resume_choice import choose_start, newest_everywhere, require_training_checkpoint
from .runner_surface import RunnerSurface
from .schedulers import build_param_schedulers
from .sharding import parse_strategy
from .signatures import check_arguments
from .sinks import SinkSet
from .train_state import TrainState
from .version import __version__
from .watchdog import watched


class Runner(RunnerSurface):
    """Train, validate and test a model with hooks; see the module docstring."""

    def __init__(
        self,
        model: nn.Module | dict,
        work_dir: str | Path,
        train_dataloader: Any = None,
        val_dataloader: Any = None,
        val_evaluator: Any = None,
        val_cfg: dict | None = None,
        test_dataloader: Any = None,
        test_evaluator: Any = None,
        test_cfg: dict | None = None,
        optim_wrapper: Any = None,
        param_scheduler: Any = None,
        train_cfg: dict | None = None,
        default_hooks: dict | None = None,
        custom_hooks: list | None = None,
        load_from: str | None = None,
        resume: bool | str = False,
        randomness: dict | None = None,
        launcher: Any = "none",
        device: str | torch.device | None = None,
        log_level: str = "INFO",
        experiment_name: str | None = None,
        model_wrapper_cfg: dict | None = None,
        preemption: Any = True,
        compile: bool | dict = False,
        strategy: Any = None,
        cfg: dict | None = None,
    ) -> None:
        self.cfg = cfg if cfg is not None else Config()
        self.launcher = launcher
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.work_dir = Path(work_dir).expanduser().resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.timestamp = time.strftime("%Y%m%d_%H%M%S")
        self.experiment_name = experiment_name or self.work_dir.name
        self.logger = setup_logger(self.work_dir, self.rank, log_level)
        self.message_hub = MessageHub()
        self.requests = ControlRequests()
        self._preemption = parse_preemption(preemption)
        # hooks and checkpoint paths first: their mistakes should not wait for data to load
        self._hooks = build_dispatcher(self, default_hooks, custom_hooks)
        # the sinks the hooks name (SinkProvider): validated on every rank, built on rank 0
        self.sinks = SinkSet.build(self._hooks.sink_specs(), build=self.rank == 0)
        self._load_from, self._resume = load_from, resume
        self.checkpoints = CheckpointWriter(self)  # save_checkpoint's writer (sync or async)
        self._has_loaded = False
        self.loading_for: str | None = None  # see _after_load
        for key, path in (
            ("load_from", load_from),
            ("resume", resume if isinstance(resume, (str, Path)) else None),
        ):
            if path and not Path(path).expanduser().is_file():
                raise ConfigError(key, f"checkpoint {str(path)!r} does not exist: check the path")
        self.seed = set_random_seed(randomness)
        self.device = torch.device(device) if device is not None else default_device()

        self.strategy = parse_strategy(strategy)  # 'ddp' or FSDP's options (sharding.py)
        self._model, self.wrapped_model = setup_model(
            model, model_wrapper_cfg, compile, self.device, self.strategy
        )
        self.val_dataloader = self.test_dataloader = None
        self.train_loop: Any = None  # a LOOPS class's loop (EpochBasedTrainLoop by default)
        self.elastic_plan: GlobalBatchPlan | None = None
        self._state = TrainState()  # the training loop's own once it is built
        self.optim_wrapper: OptimWrapper | None = None
        self.param_schedulers: list = []
        self._build_training(train_dataloader, train_cfg, optim_wrapper, param_scheduler)
        val_cfg, self.val_mode = split_val_cfg(val_cfg)  # mode/lag/resources: async_val_config
        self.val_loop = self._build_eval("val", val_dataloader, val_evaluator, val_cfg, ValLoop)
        self.test_loop = self._build_eval(
            "test", test_dataloader, test_evaluator, test_cfg, TestLoop
        )

        self.logger.info(
            "distributed-runner %s | torch %s | device %s | world size %d%s | seed "
            "%d | work_dir %s",
            __version__,
            torch.__version__,
            self.device,
            self.world_size,
            f" ({self.elastic_plan.describe()})" if self.elastic_plan else "",
            self.seed,
            self.work_dir,
        )
        # the whole hook plan to the log file, a short one to the terminal (quiet_log.py)
        plan = plan_summary(
            self._hooks.entries, self._hooks.sink_specs(), run_log_file(self.logger)
        )
        log_brief_and_full(self.logger, plan, self._hooks.plan_text())

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_cfg(cls, cfg: dict) -> Runner:
        """A Runner from a config (a :class:`Config` or a plain dict, as on a Ray worker).

        The config is prepared by the same function the Ray driver checks it with
        (:func:`prepare_config`): a worker applies no rule the driver did not, the device aside."""
        cfg, notes = prepare_config(cfg)  # iMIX notes: logged once the Runner's logger exists
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
        loader, optim_wrapper, self.elastic_plan = elastic_training(  # elastic.py, else as is
            build_dataloader(dataloader, "train_dataloader", self.seed),
            optim_wrapper,
            self.launcher,
            self.world_size,
            self.rank,
        )
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
        :class:`~hooks.extension_points.CheckpointSaver` (CheckpointHook), so retention and the
        ``last_checkpoint`` pointer stay right; else ``work_dir/iter_{N}.pth`` directly."""
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
            watched(self),  # the hang watch (watchdog.py)
            preemption_signals(self._preemption, self.requests, self.logger),
            self.sinks.opened(self),
            self.hook_bracket("before_run", "after_run"),
        ):
            self._load_or_resume()
            self.optim_wrapper.initialize_count_status(self.iter, self.max_iters)
            self.train_loop.run()
            self.checkpoints.wait()  # an asynchronous save still in flight commits now
        return self.model

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
            )  # resume_choice.py decides
            if path is None:  # a fresh start
                return
            if how == "resume":
                self.resume(path, ckpt)
            elif how == "load_from":
                self.load_checkpoint(path)

    def load_checkpoint(
        self, path: str | Path, strict: bool = True, map_location: Any = "cpu"
    ) -> dict:
        """Load model weights only (``load_from``); returns the checkpoint dict."""
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
        """Assemble the checkpoint (the parts :data:`~.checkpoint_parts.PARTS` declares) on
        every rank; rank 0 writes it atomically (with sharded FSDP checkpoints every rank writes
        its shards); ``asynchronous`` writes in the background. Call it on every rank; see
        :mod:`distributed_runner.checkpoint_writer`."""
        return self.checkpoints.save(
            Path(out_dir) / filename, save_optimizer, save_param_scheduler, meta, asynchronous
        )
