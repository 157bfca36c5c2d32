"""The hook API and the built-in hooks.

``from hooks import Hook, HOOKS, Priority`` is all a user hook needs; ``HOOKS`` is the same object
as ``distributed_runner.core.registry.HOOKS``. The Hook API itself (the base class, priorities,
the extension points) lives in the engine (:mod:`distributed_runner.engine.hook`, ``.priority``,
``.extension_points``) and is offered here; this package holds the built-in hooks, one a file, and
sits above the engine (the import contracts in ``pyproject.toml``). The built-in hooks are
imported on first use (``from hooks import CheckpointHook``, or the first look-up of a name in
``HOOKS``), so ``import hooks`` loads neither them nor the Runner.
"""

from __future__ import annotations

import importlib
from typing import Any

from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.extension_points import (
    CheckpointSaver,
    RankFigures,
    SinkProvider,
    StepGuard,
)
from distributed_runner.engine.hook import (
    ADDED_MOUNT_POINTS,
    MMENGINE_MOUNT_POINTS,
    MOUNT_POINTS,
    Hook,
)
from distributed_runner.engine.priority import Priority, get_priority, priority_name
from hooks.builtin_names import BUILTIN_HOOKS

__all__ = [
    "ADDED_MOUNT_POINTS",
    "HOOKS",
    "MMENGINE_MOUNT_POINTS",
    "MOUNT_POINTS",
    "CheckpointSaver",
    "Hook",
    "Priority",
    "RankFigures",
    "SinkProvider",
    "StepGuard",
    "get_priority",
    "overrides",
    "priority_name",
]
__all__ += list(BUILTIN_HOOKS)  # the built-in hooks' names, imported on first use


def __getattr__(name: str) -> Any:
    module = BUILTIN_HOOKS.get(name)
    if module is None:
        raise AttributeError(f"module 'hooks' has no attribute {name!r}")
    return getattr(importlib.import_module(f"hooks.{module}"), name)
