"""From ``default_hooks`` and ``custom_hooks`` in a config to named hook instances.

Override rules for ``default_hooks`` (a dict keyed by name):

* ``None``                removes that default hook;
* a dict with ``type``    replaces it;
* a dict without ``type`` updates the default's arguments;
* a ``Hook`` instance     replaces it;
* a new name              adds a hook (after the defaults, before ``custom_hooks``).

``custom_hooks`` is a list of dicts or ``Hook`` instances registered after the defaults. Reserved
keys in a hook's dict, taken out before the hook is built and handled by the dispatcher:

* ``priority`` — wins over the class attribute;
* ``name`` — the registered name (default: the class name in snake_case without ``Hook``, e.g.
  ``CheckInvalidLossHook`` -> ``check_invalid_loss``);
* ``on_error`` — ``'raise'`` / ``'warn'`` / ``'disable'`` (wins over the class attribute);
* ``before`` / ``after`` — registered names this hook must run before / after (same priority);
* ``level`` — iMIX's priority key, on iMIX's scale
  (:func:`distributed_runner.engine.priority.imix_level`), unless the hook's constructor takes an
  argument of that name.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from distributed_runner.core.config_values import show_value
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import HOOKS
from distributed_runner.core.signatures import accepts
from distributed_runner.engine.hook import Hook
from distributed_runner.engine.priority import imix_level

DEFAULT_HOOKS: dict[str, dict] = {
    "runtime_info": {"type": "RuntimeInfoHook"},
    "timer": {"type": "IterTimerHook"},
    "sampler_seed": {"type": "DistSamplerSeedHook"},
    "logger": {"type": "LoggerHook"},
    "param_scheduler": {"type": "ParamSchedulerHook"},
    "checkpoint": {"type": "CheckpointHook", "interval": 1},
    "straggler": {"type": "StragglerHook"},  # attaches nothing in a single process
}

RESERVED_KEYS = ("priority", "name", "on_error", "before", "after")

# Hooks a launcher adds to every worker's hooks, after the config's (shown by
# ``drun hooks --launcher ray``): under Ray, every saved checkpoint is reported to Ray Train.
LAUNCHER_HOOKS: dict[str, list[dict]] = {
    "ray": [
        {"type": "RayReportHook", "name": "ray_report"},
        {"type": "RayPauseHook", "name": "ray_pause"},
    ],
}


def launcher_type(launcher: Any) -> str:
    """``'none'`` or ``'ray'`` for a config's ``launcher`` value (a name or ``dict(type=...)``)."""
    if launcher is None:
        return "none"
    if isinstance(launcher, dict):
        return str(launcher.get("type", "ray"))
    return str(launcher)


def custom_hook_list(custom_hooks: Any) -> list:
    """``custom_hooks`` as a list (``[]`` for None), else the one error for its shape.

    Checked here and nowhere else because every way to hooks comes through this module:
    ``Runner.from_cfg``, a Runner built in Python, the Ray driver and each worker, ``drun hooks``.
    """
    if custom_hooks is None:
        return []
    if not isinstance(custom_hooks, (list, tuple)):
        raise ConfigError(
            "custom_hooks",
            f"got {show_value(custom_hooks)}; takes a list of hook "
            f"configs, e.g. [dict(type='EMAHook')]",
        )
    return list(custom_hooks)


def with_launcher_hooks(custom_hooks: list | None, launcher: Any) -> list:
    """``custom_hooks`` followed by the hooks ``launcher`` adds (:data:`LAUNCHER_HOOKS`)."""
    return [*custom_hook_list(custom_hooks), *LAUNCHER_HOOKS.get(launcher_type(launcher), [])]


def default_name(hook_type: Any) -> str:
    """``CheckInvalidLossHook`` -> ``check_invalid_loss``; ``EMAHook`` -> ``ema``."""
    name = hook_type if isinstance(hook_type, str) else getattr(hook_type, "__name__", "hook")
    name = re.sub(r"Hook$", "", name) or name
    name = name.replace("MLflow", "Mlflow")  # a brand, not an acronym followed by a word
    name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
    return name.lower()


def merge_default_hooks(user: dict | None) -> dict[str, Any]:
    """Apply the user's ``default_hooks`` to the built-in set (rules in the module docstring).

    The only check that ``default_hooks`` is a dict, for the reason :func:`custom_hook_list` gives.
    """
    merged: dict[str, Any] = copy.deepcopy(DEFAULT_HOOKS)
    if user is None:
        return merged
    if not isinstance(user, dict):
        raise ConfigError(
            "default_hooks",
            f"got {show_value(user)}; takes a dict of name -> hook config (None removes a default)",
        )
    for name, spec in user.items():
        if spec is None:
            merged.pop(name, None)
        elif isinstance(spec, Hook):
            merged[name] = spec
        elif isinstance(spec, dict):
            if "type" in spec or name not in merged or isinstance(merged[name], Hook):
                if "type" not in spec:
                    raise ConfigError(
                        f"default_hooks.{name}", "a new hook needs 'type' (e.g. type='EMAHook')"
                    )
                merged[name] = dict(spec)
            else:
                merged[name].update(spec)
        else:
            raise ConfigError(
                f"default_hooks.{name}",
                f"expected a dict, a Hook or None, got {type(spec).__name__}",
            )
    return merged


def build_hook(spec: Any, key: str) -> tuple[Hook, dict]:
    """Build one hook; returns the hook and its reserved keys (see :data:`RESERVED_KEYS`)."""
    if isinstance(spec, Hook):
        return spec, {}
    if not isinstance(spec, dict):
        raise ConfigError(key, f"expected a hook config dict or a Hook, got {type(spec).__name__}")
    args = dict(spec)
    reserved = {k: args.pop(k) for k in RESERVED_KEYS if k in args}
    if (
        "level" in args
        and "type" in args
        and not accepts(HOOKS.resolve(args["type"], key), "level")
    ):
        if "priority" in reserved:
            raise ConfigError(
                f"{key}.level", "give priority (MMEngine's scale) or level (iMIX's), not both"
            )
        reserved["priority"] = imix_level(args.pop("level"), f"{key}.level")
    hook = HOOKS.build(args, key)
    if not isinstance(hook, Hook):
        raise ConfigError(
            f"{key}.type", f"{type(hook).__name__} is not a Hook: subclass hooks.Hook"
        )
    return hook, reserved


def resolve_hooks(
    default_hooks: dict | None, custom_hooks: list | None
) -> list[tuple[str, Hook, dict, str]]:
    """All hooks to register: ``(name, hook, reserved keys, config key)`` in registration order."""
    out: list[tuple[str, Hook, dict, str]] = []
    for name, spec in merge_default_hooks(default_hooks).items():
        key = f"default_hooks.{name}"
        hook, reserved = build_hook(spec, key)
        reserved.pop("name", None)  # a default hook's name is its key
        out.append((name, hook, reserved, key))
    taken = {name for name, *_ in out}
    for i, spec in enumerate(custom_hook_list(custom_hooks)):
        key = f"custom_hooks[{i}]"
        hook, reserved = build_hook(spec, key)
        name = reserved.get("name") or default_name(
            spec.get("type") if isinstance(spec, dict) else type(spec)
        )
        if "name" not in reserved:
            base, n = name, 1
            while name in taken:
                name, n = f"{base}_{n}", n + 1
        taken.add(name)
        reserved.pop("name", None)
        out.append((name, hook, reserved, key))
    return out


def build_dispatcher(owner: Any, default_hooks: dict | None, custom_hooks: list | None):
    """A HookDispatcher for ``owner`` with every configured hook registered and checked
    (priorities, mount-point names) — what the Runner, the Ray driver and ``drun hooks`` use."""
    from distributed_runner.engine.dispatch import HookDispatcher

    dispatcher = HookDispatcher(owner)
    for name, hook, reserved, key in resolve_hooks(default_hooks, custom_hooks):
        dispatcher.register(hook, name, key=key, strict=False, **reserved)
    dispatcher.check()
    return dispatcher


def plan_hooks(cfg: Any):
    """The config's hooks as its launcher runs them, with their sinks checked but not built —
    what the Ray driver validates and ``drun hooks`` prints (no Runner, no model, no data)."""
    from distributed_runner.tracking.sinks import SinkSet

    hooks = build_dispatcher(
        HookPlanOwner(),
        cfg.get("default_hooks"),
        with_launcher_hooks(cfg.get("custom_hooks"), cfg.get("launcher")),
    )
    SinkSet.build(hooks.sink_specs(), build=False)
    return hooks


class HookPlanOwner:
    """Stands in for the runner when hooks are only planned (``drun hooks``, driver checks)."""
