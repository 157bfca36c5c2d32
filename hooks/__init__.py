"""The hook API and the built-in hooks.

``from hooks import Hook, HOOKS, Priority`` is all a user hook needs; ``HOOKS`` is the same object
as ``distributed_runner.registry.HOOKS``. Importing this package registers the built-in hooks.
"""
from distributed_runner.registry import HOOKS

from .checkpoint_hook import CheckpointHook
from .hook import MOUNT_POINTS, Hook
from .iter_timer_hook import IterTimerHook
from .logger_hook import LoggerHook
from .mlflow_checkpoint_hook import MLflowCheckpointHook
from .param_scheduler_hook import ParamSchedulerHook
from .priority import Priority, get_priority
from .runtime_info_hook import RuntimeInfoHook
from .sampler_seed_hook import DistSamplerSeedHook
from .sync_buffers_hook import SyncBuffersHook

__all__ = [
    "HOOKS", "Hook", "MOUNT_POINTS", "Priority", "get_priority",
    "CheckpointHook", "DistSamplerSeedHook", "IterTimerHook", "LoggerHook", "MLflowCheckpointHook",
    "ParamSchedulerHook",
    "RuntimeInfoHook", "SyncBuffersHook",
]
