"""Built-in hook class name -> the module in ``hooks`` that defines it (no imports here)."""

# class name -> module, for ``from hooks import CheckpointHook`` (loaded on first use)
BUILTIN_HOOKS: dict[str, str] = {
    "AutogradAnomalyDetectHook": "autograd_anomaly_detect_hook",
    "CheckInvalidLossHook": "check_invalid_loss_hook",
    "CheckpointHook": "checkpoint_hook",
    "DistSamplerSeedHook": "sampler_seed_hook",
    "EarlyStoppingHook": "early_stopping_hook",
    "EMAHook": "ema_hook",
    "EmptyCacheHook": "empty_cache_hook",
    "IterTimerHook": "iter_timer_hook",
    "LoggerHook": "logger_hook",
    "MLflowCheckpointHook": "mlflow_checkpoint_hook",
    "NaiveVisualizationHook": "naive_visualization_hook",
    "NonFiniteLossHook": "non_finite_loss_hook",
    "NPUProfilerHook": "npu_profiler_hook",
    "ParamSchedulerHook": "param_scheduler_hook",
    "PrepareTTAHook": "prepare_tta_hook",
    "ProfilerHook": "profiler_hook",
    "RayReportHook": "ray_report_hook",
    "RayTrialHook": "ray_trial_hook",
    "RuntimeInfoHook": "runtime_info_hook",
    "StragglerHook": "straggler_hook",
    "SyncBuffersHook": "sync_buffers_hook",
    "TuneForkHook": "tune_fork_hook",
    "TuneReportHook": "tune_report_hook",
    "VisualizationHook": "visualization_hook",
}
