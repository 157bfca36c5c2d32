"""The hook API and the built-in hooks.

``from hooks import Hook, HOOKS, Priority`` is all a user hook needs; ``HOOKS`` is the same object
as ``distributed_runner.registry.HOOKS``. Importing this package registers the built-in hooks.
"""
from distributed_runner.registry import HOOKS

from .autograd_anomaly_detect_hook import AutogradAnomalyDetectHook
from .check_invalid_loss_hook import CheckInvalidLossHook
from .checkpoint_hook import CheckpointHook
from .early_stopping_hook import EarlyStoppingHook
from .ema_hook import EMAHook
from .empty_cache_hook import EmptyCacheHook
from .hook import MOUNT_POINTS, Hook
from .iter_timer_hook import IterTimerHook
from .logger_hook import LoggerHook
from .mlflow_checkpoint_hook import MLflowCheckpointHook
from .non_finite_loss_hook import NonFiniteLossHook
from .param_scheduler_hook import ParamSchedulerHook
from .prepare_tta_hook import PrepareTTAHook
from .priority import Priority, get_priority
from .profiler_hook import ProfilerHook
from .runtime_info_hook import RuntimeInfoHook
from .sampler_seed_hook import DistSamplerSeedHook
from .sync_buffers_hook import SyncBuffersHook
from .visualization_hook import VisualizationHook

__all__ = [
    "HOOKS", "Hook", "MOUNT_POINTS", "Priority", "get_priority",
    "AutogradAnomalyDetectHook", "CheckInvalidLossHook", "CheckpointHook", "DistSamplerSeedHook",
    "EarlyStoppingHook", "EMAHook", "EmptyCacheHook", "IterTimerHook", "LoggerHook",
    "MLflowCheckpointHook", "NonFiniteLossHook", "ParamSchedulerHook", "PrepareTTAHook",
    "ProfilerHook", "RuntimeInfoHook", "SyncBuffersHook", "VisualizationHook",
]
