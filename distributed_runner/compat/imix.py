"""iMIX's hook type names in ``custom_hooks`` (seed 004's table), configured as what does the same
here.

In iMIX, optimizing, LR scheduling, evaluation, checkpointing and logging are hooks a config lists;
here most of them are config keys or default hooks. So an iMIX hook entry is taken out of
``custom_hooks``, its equivalent is set in the config, and one line says what it became
(``custom_hooks[2]: iMIX's CheckPointHook -> default_hooks.checkpoint: interval=500,
by_epoch=False``) — logged when the Runner is built. What cannot be carried over is a one-line
error naming the argument, not a silent drop. A hook the user registered under one of these names
is theirs and stays as it is.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from distributed_runner.core.errors import ConfigError

Rule = Callable[[dict, dict, str], str]


def _hooks_section(cfg: dict, name: str, default_type: str) -> dict:
    """``cfg.default_hooks[name]`` as a dict to update (created, or copied, never shared)."""
    hooks = cfg["default_hooks"] = dict(cfg.get("default_hooks") or {})
    spec = hooks.get(name)
    if spec is None:
        spec = {"type": default_type} if name in hooks else {}
    elif not isinstance(spec, dict):
        raise ConfigError(
            f"default_hooks.{name}",
            "is a Hook instance: an iMIX hook in custom_hooks cannot update it; configure it there",
        )
    hooks[name] = spec = copy.deepcopy(spec)
    return spec


def _refuse(args: dict, key: str, unsupported: tuple[str, ...], instead: str) -> None:
    for name in unsupported:
        if args.get(name) is not None:
            raise ConfigError(f"{key}.{name}", f"iMIX's argument has no equivalent here; {instead}")


def _optimizer(cfg: dict, args: dict, key: str, amp: bool = False) -> str:
    _refuse(
        args, key, ("grad_scaler_config",), "set optim_wrapper.loss_scale ('dynamic' or a number)"
    )
    optim = cfg["optim_wrapper"] = dict(cfg.get("optim_wrapper") or {})  # the caller's intact
    done = []
    if amp:
        optim["type"], done = "AmpOptimWrapper", ["type='AmpOptimWrapper'"]
        optim.setdefault("dtype", "float16")
    if args.get("grad_clip"):
        optim["clip_grad"] = dict(args["grad_clip"])
        done.append(f"clip_grad={optim['clip_grad']}")
    return (
        "optim_wrapper: " + ", ".join(done)
        if done
        else "nothing to set (the OptimWrapper steps; optim_wrapper.clip_grad clips)"
    )


def _checkpoint(cfg: dict, args: dict, key: str) -> str:
    _refuse(args, key, ("checkpointer",), "CheckpointHook saves through the Runner")
    spec = _hooks_section(cfg, "checkpoint", "CheckpointHook")
    if args.get("iter_period"):
        spec.update(interval=int(args["iter_period"]), by_epoch=False)
    else:
        spec.update(interval=int(args.get("epoch_period", 1)), by_epoch=True)
    if args.get("max_num_checkpoints"):
        spec["max_keep_ckpts"] = int(args["max_num_checkpoints"])
    if args.get("prefix"):
        spec["filename_tmpl"] = f"{args['prefix']}_{{}}.pth"
    shown = ", ".join(f"{k}={v!r}" for k, v in spec.items() if k != "type")
    return f"default_hooks.checkpoint: {shown}"


def _sink(name: str, sink_type: str, path_arg: str = "", path_key: str = "") -> Rule:
    """Add the sink to LoggerHook's; iMIX's file argument becomes the sink's (``log_dir`` ->
    TensorBoardSink ``log_dir``); what has no equivalent is named in the note."""

    def rule(cfg: dict, args: dict, key: str) -> str:
        spec = _hooks_section(cfg, "logger", "LoggerHook")
        sinks = list(spec.get("sinks", ("terminal", "jsonl")))
        ignored = [k for k in args if k != path_arg]
        tail = f" ({', '.join(ignored)}: no equivalent, not used)" if ignored else ""
        if path_arg in args:
            sinks = [s for s in sinks if s != name]
            sinks.append({"type": sink_type, path_key: args[path_arg]})
            spec["sinks"] = sinks
            return f"default_hooks.logger.sinks: {sinks}{tail}"
        if name in sinks:
            return f"default_hooks.logger.sinks already has {name!r}{tail}"
        spec["sinks"] = [*sinks, name]
        return f"default_hooks.logger.sinks += [{name!r}]{tail}"

    return rule


def _periodic_logger(cfg: dict, args: dict, key: str) -> str:
    spec = _hooks_section(cfg, "logger", "LoggerHook")
    if args.get("log_config_period"):
        spec["interval"] = int(args["log_config_period"])
        return f"default_hooks.logger: interval={spec['interval']}"
    return "default_hooks.logger (LoggerHook, every 10 iterations)"


def _evaluate(cfg: dict, args: dict, key: str) -> str:
    _refuse(args, key, ("eval_function",), "set val_dataloader, val_evaluator and val_cfg")
    train_cfg = cfg["train_cfg"] = dict(cfg.get("train_cfg") or {})
    if args.get("eval_iter_period") and train_cfg.get("by_epoch", True) is False:
        train_cfg["val_interval"] = int(args["eval_iter_period"])
        return (
            f"train_cfg.val_interval={train_cfg['val_interval']} (val_dataloader, "
            f"val_evaluator, val_cfg)"
        )
    return "train_cfg.val_interval / val_begin with val_dataloader, val_evaluator and val_cfg"


def _note(text: str) -> Rule:
    return lambda cfg, args, key: text


def _replaced_by(hook_type: str, keep: tuple[str, ...] = ()) -> Rule:
    def rule(cfg: dict, args: dict, key: str) -> str:
        spec = {"type": hook_type, **{k: args[k] for k in keep if k in args}}
        cfg.setdefault("custom_hooks", []).append(spec)
        ignored = [k for k in args if k not in keep]
        tail = f" ({', '.join(ignored)}: no equivalent, not used)" if ignored else ""
        return f"custom_hooks += [{spec}]{tail}"

    return rule


RULES: dict[str, Rule] = {
    "OptimizerHook": _optimizer,
    "Fp16OptimizerHook": lambda cfg, args, key: _optimizer(cfg, args, key, amp=True),
    "LRSchedulerHook": _note("ParamSchedulerHook (a default hook) steps param_scheduler=[...]"),
    "EvaluateHook": _evaluate,
    "IterationTimerHook": _note("IterTimerHook (the default timer)"),
    "CheckPointHook": _checkpoint,
    "PeriodicCheckpointHook": _checkpoint,
    "PeriodicLogger": _periodic_logger,
    "CommonMetricLoggerHook": _sink("terminal", "TerminalSink"),
    "JSONLoggerHook": _sink("jsonl", "JsonlSink", "json_file", "filename"),
    "TensorboardLoggerHook": _sink("tensorboard", "TensorBoardSink", "log_dir", "log_dir"),
    "AutogradProfilerHook": _replaced_by("ProfilerHook"),
}


# iMIX names (its hook registry, its tutorial, its hook bases) that configure nothing here: a config
# naming one unregistered gets what to do and the README's table, not a look-alike of ours
NO_EQUIVALENT: dict[str, str] = {
    "EMAIterHook": "the iMIX tutorial's example: register your class with "
    "@HOOKS.register_module() (it runs as written), or use EMAHook",
    "EMAEpochHook": "an iMIX hook: register your class with @HOOKS.register_module() (it runs "
    "as written), or use EMAHook",
    "TextLoggerHook": "iMIX's debugging hook that logs a text at three mount points; LoggerHook "
    "(a default hook) logs training, or register your own hook",
    "MomentumSchedulerHook": "an empty hook in iMIX; momentum is scheduled by param_scheduler "
    "entries with param_name='momentum', stepped by ParamSchedulerHook",
    "HookBase": "iMIX's hook base class: subclass hooks.Hook and register the subclass",
    "LogBufferWriter": "an iMIX base class of its logger hooks: use LoggerHook's sinks",
    "PeriodicCheckpointer": "an iMIX checkpointing class: use CheckpointHook (default_hooks."
    "checkpoint)",
}
IMIX_TABLE = "see the README's iMIX table ('MMEngine and iMIX users')"


def translate_imix_hooks(cfg: dict) -> list[str]:
    """Replace iMIX hook entries of ``cfg['custom_hooks']`` by their equivalents (in place);
    returns one note per entry replaced. Any other shape is left for the hook builder to refuse
    (:func:`~distributed_runner.engine.hook_builder.custom_hook_list`)."""
    hooks = cfg.get("custom_hooks")
    if not isinstance(hooks, (list, tuple)):
        return []
    from distributed_runner.core.registry import HOOKS

    kept: list[Any] = []
    notes: list[str] = []
    added: list[str] = []
    for i, spec in enumerate(hooks):
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind in NO_EQUIVALENT and HOOKS.get(kind) is None:
            raise ConfigError(
                f"custom_hooks[{i}].type",
                f"{kind!r} is not registered: it is {NO_EQUIVALENT[kind]}; {IMIX_TABLE}",
            )
        if not isinstance(kind, str) or kind not in RULES or HOOKS.get(kind) is not None:
            kept.append(spec)
            continue
        args = {k: v for k, v in spec.items() if k not in ("type", "level", "priority", "name")}
        cfg["custom_hooks"] = added  # a rule that adds a hook adds it here
        notes.append(
            f"custom_hooks[{i}]: iMIX's {kind} -> {RULES[kind](cfg, args, f'custom_hooks[{i}]')}"
        )
    cfg["custom_hooks"] = kept + added
    return notes
