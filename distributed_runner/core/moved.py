"""Where the modules of the flat layout (0.1) went, so that what users wrote against it keeps
working.

Configs name classes by import path (``type='distributed_runner.tta.TTAModel'``), user code and
ported OpenMMLab hooks import modules (``from distributed_runner.registry import MODELS``), and
checkpoints written by 0.1 pickle objects under their module's name. :data:`MOVED` maps each old
module to its new one; :func:`install` puts a finder on ``sys.meta_path`` that answers an old
name with the new module itself (the same object, so ``isinstance`` and monkeypatching agree) and
warns once, with a ``DeprecationWarning`` that says where to import it from. A name that was
never a module of this project is left to the normal import machinery, which fails as usual.

Four old modules became packages of the same name (``checkpoint``, ``model``, ``optim``,
``data``); their ``__init__`` forwards the old module's names (see :func:`forward_names`).

This module imports nothing from the project: :mod:`distributed_runner` installs it before any
other import.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

MOVED: dict[str, str] = {
    "distributed_runner.async_val": "distributed_runner.validation.async_validation",
    "distributed_runner.async_val_backends": "distributed_runner.validation.backends",
    "distributed_runner.async_val_config": "distributed_runner.validation.async_validation",
    "distributed_runner.async_val_worker": "distributed_runner.launch.validation_worker",
    "distributed_runner.averaged_model": "distributed_runner.model.averaged",
    "distributed_runner.checkpoint_parts": "distributed_runner.checkpoint.parts",
    "distributed_runner.checkpoint_state": "distributed_runner.checkpoint.state",
    "distributed_runner.checkpoint_types": "distributed_runner.checkpoint.types",
    "distributed_runner.checkpoint_writer": "distributed_runner.checkpoint.writer",
    "distributed_runner.classifier": "distributed_runner.model.classifier",
    "distributed_runner.config": "distributed_runner.core.config",
    "distributed_runner.config_check": "distributed_runner.engine.config_check",
    "distributed_runner.config_prep": "distributed_runner.engine.config_prep",
    "distributed_runner.control": "distributed_runner.engine.requests",
    "distributed_runner.counting": "distributed_runner.core.interval",
    "distributed_runner.dispatch": "distributed_runner.engine.dispatch",
    "distributed_runner.dispatch_tables": "distributed_runner.engine.dispatch",
    "distributed_runner.dist": "distributed_runner.core.dist",
    "distributed_runner.elastic": "distributed_runner.data.elastic",
    "distributed_runner.errors": "distributed_runner.core.errors",
    "distributed_runner.eval_loops": "distributed_runner.engine.loops",
    "distributed_runner.evaluator": "distributed_runner.evaluation.evaluator",
    "distributed_runner.external": "distributed_runner.core.external",
    "distributed_runner.hang_watch": "distributed_runner.health.hang_watch",
    "distributed_runner.heartbeat": "distributed_runner.health.heartbeat",
    "distributed_runner.history_buffer": "distributed_runner.engine.history_buffer",
    "distributed_runner.hook_builder": "distributed_runner.engine.hook_builder",
    "distributed_runner.hook_order": "distributed_runner.engine.hook_order",
    "distributed_runner.hook_report": "distributed_runner.engine.hook_report",
    "distributed_runner.imix_compat": "distributed_runner.compat.imix",
    "distributed_runner.interval": "distributed_runner.core.interval",
    "distributed_runner.launcher": "distributed_runner.launch.launcher",
    "distributed_runner.launcher_config": "distributed_runner.launch.launcher_config",
    "distributed_runner.lm_metric": "distributed_runner.evaluation.lm_metric",
    "distributed_runner.log": "distributed_runner.core.log",
    "distributed_runner.loops": "distributed_runner.engine.loops",
    "distributed_runner.message_hub": "distributed_runner.engine.message_hub",
    "distributed_runner.metric_rules": "distributed_runner.evaluation.metric_rules",
    "distributed_runner.model_setup": "distributed_runner.model.build",
    "distributed_runner.model_steps": "distributed_runner.engine.step_choice",
    "distributed_runner.optim_constructor": "distributed_runner.optim.constructor",
    "distributed_runner.plot": "distributed_runner.tracking.plot",
    "distributed_runner.preemption": "distributed_runner.core.preemption",
    "distributed_runner.quiet_log": "distributed_runner.core.log",
    "distributed_runner.randomness": "distributed_runner.core.randomness",
    "distributed_runner.ray_connect": "distributed_runner.launch.ray_connect",
    "distributed_runner.ray_data": "distributed_runner.data.ray_data",
    "distributed_runner.ray_worker": "distributed_runner.launch.ray_worker",
    "distributed_runner.recompute": "distributed_runner.model.activation_checkpointing",
    "distributed_runner.redact": "distributed_runner.core.redact",
    "distributed_runner.registry": "distributed_runner.core.registry",
    "distributed_runner.remote_storage": "distributed_runner.checkpoint.remote",
    "distributed_runner.resume_choice": "distributed_runner.checkpoint.resume_choice",
    "distributed_runner.runner": "distributed_runner.engine.runner",
    "distributed_runner.runner_api": "distributed_runner.core.runner_api",
    "distributed_runner.runner_surface": "distributed_runner.engine.runner",
    "distributed_runner.schedulers": "distributed_runner.optim.schedulers",
    "distributed_runner.sharded_checkpoint": "distributed_runner.checkpoint.sharded",
    "distributed_runner.sharding": "distributed_runner.model.sharding",
    "distributed_runner.signatures": "distributed_runner.core.signatures",
    "distributed_runner.sinks": "distributed_runner.tracking.sinks",
    "distributed_runner.sinks.base": "distributed_runner.tracking.sinks.base",
    "distributed_runner.sinks.jsonl": "distributed_runner.tracking.sinks.jsonl",
    "distributed_runner.sinks.mlflow": "distributed_runner.tracking.sinks.mlflow",
    "distributed_runner.sinks.mlflow_sender": "distributed_runner.tracking.sinks.mlflow_sender",
    "distributed_runner.sinks.parquet": "distributed_runner.tracking.sinks.parquet",
    "distributed_runner.sinks.record_queue": "distributed_runner.tracking.sinks.record_queue",
    "distributed_runner.sinks.service": "distributed_runner.tracking.sinks.service",
    "distributed_runner.sinks.tensorboard": "distributed_runner.tracking.sinks.tensorboard",
    "distributed_runner.sinks.terminal": "distributed_runner.tracking.sinks.terminal",
    "distributed_runner.sinks.wandb": "distributed_runner.tracking.sinks.wandb",
    "distributed_runner.step": "distributed_runner.engine.step",
    "distributed_runner.throughput": "distributed_runner.tracking.throughput",
    "distributed_runner.train_state": "distributed_runner.engine.train_state",
    "distributed_runner.tta": "distributed_runner.model.tta",
    "distributed_runner.utils": "distributed_runner.compat.mmengine_utils",
    "distributed_runner.watchdog": "distributed_runner.health.watchdog",
    "distributed_runner.watchdog_config": "distributed_runner.health.watchdog",
    "hooks.checkpoint_args": "hooks.checkpoint_hook",
    "hooks.checkpoint_publish": "distributed_runner.checkpoint.publish",
    "hooks.extension_points": "distributed_runner.engine.extension_points",
    "hooks.hook": "distributed_runner.engine.hook",
    "hooks.priority": "distributed_runner.engine.priority",
}


def new_location(name: str) -> str | None:
    """The module an old module name now lives at, or None for a name that did not move."""
    return MOVED.get(name)


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module name with the module it became (see the module docstring)."""

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}: import it from there (the old name works until 1.0)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """The module was executed under its new name already."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once, first: an old name under a package that moved
    whole (``distributed_runner.sinks.mlflow``) would otherwise be found by the path finder in
    the new package's folder and run a second time, as a second module with its own classes."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())


def forward_names(package: str, module: str) -> Any:
    """A PEP 562 ``__getattr__`` for a package that replaced a module of the same name: the
    package's unknown attributes are looked up in ``module`` (where the old module's code went),
    so ``from distributed_runner.optim import OptimWrapper`` keeps working."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        target = importlib.import_module(module)
        try:
            return getattr(target, name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__
