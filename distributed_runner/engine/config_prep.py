"""One preparation of a config, shared by ``Runner.from_cfg`` and the Ray driver.

Why one function: the Ray driver checks a config before any worker starts, and every worker's
``Runner.from_cfg`` prepares the same config again. Written twice, the two copies drifted apart
(the same mistake worded two ways, a rule in one and not the other); here each step is written
once, in this order:

1. ``custom_imports`` are imported, so the user's ``@register_module()`` classes exist (a worker
   never loaded the config file, so :meth:`Config.fromfile` did not do it there);
2. ``default_scope`` is set (MMEngine's key: names of that scope resolve first);
3. ``work_dir`` and ``model`` are required;
4. iMIX hook entries of ``custom_hooks`` become what does the same here
   (:mod:`~distributed_runner.compat.imix`); the notes saying so are returned for the Runner to log;
5. types and ranges of the engine-owned keys, and near-misses of their names
   (:mod:`~distributed_runner.engine.config_check`);
6. every declared section parsed once by its owner's parser
   (:mod:`~distributed_runner.engine.sections`): the read-only settings, kept with the config
   (:func:`~distributed_runner.engine.sections.settings_of`) for the Runner, its hooks and the Ray
   driver to read instead of parsing again.

What only the driver adds (the sections' driver steps: paths made absolute, the model built on the
meta device, the hooks planned) is :func:`~distributed_runner.launch.launcher.validate_config`;
what a Runner does with the result (building) stays in the Runner.
"""

from __future__ import annotations

from distributed_runner.compat.imix import translate_imix_hooks
from distributed_runner.core.config import Config, import_custom_modules, to_config_dict
from distributed_runner.core.env_cfg import check_env_cfg
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import set_default_scope
from distributed_runner.engine.config_check import check_config
from distributed_runner.engine.sections import attach_settings, parse_sections, settings_of

# the Runner's constructor arguments, which a config may set at its top level
RUNNER_KEYS = (
    "model",
    "work_dir",
    "train_dataloader",
    "val_dataloader",
    "val_evaluator",
    "val_cfg",
    "test_dataloader",
    "test_evaluator",
    "test_cfg",
    "optim_wrapper",
    "param_scheduler",
    "train_cfg",
    "default_hooks",
    "custom_hooks",
    "load_from",
    "resume",
    "randomness",
    "launcher",
    "device",
    "log_level",
    "experiment_name",
    "model_wrapper_cfg",
    "preemption",
    "compile",
    "strategy",
    "run_name",
)
# top-level config keys the Runner does not take but other parts of the project read
# (watchdog: distributed_runner.health.watchdog; tune: the sweep block of ``drun tune``;
# fault_tolerance: distributed_runner.fault_tolerance and its launcher)
OTHER_CONFIG_KEYS = (
    "custom_imports", "env_cfg", "default_scope", "watchdog", "tune", "fault_tolerance",
)  # fmt: skip
# their types and meanings, for the generated config reference
OTHER_CONFIG_DOCS: dict[str, tuple[str, str]] = {
    "custom_imports": ("dict | list", "modules imported before anything is built (your classes)"),
    "env_cfg": (
        "dict",
        "num_threads: torch's threads (a sweep's best config repeats its trial's); "
        "MMEngine's cudnn_benchmark, mp_cfg, dist_cfg have no effect",
    ),
    "default_scope": ("str", "the registry scope unprefixed type names resolve in (e.g. mmdet)"),
    "watchdog": ("dict | bool", "the hang watch and straggler detection (see Hangs)"),
    "tune": ("dict", "the sweep drun tune runs: param_space, search_alg, scheduler, ..."),
    "fault_tolerance": (
        "dict | None",
        "replica processes that survive a lost one without a restart (see Survive a lost worker)",
    ),
}

NOTES_ATTR = "_drun_prepare_notes"  # the iMIX notes of a prepared config, for whoever logs them

# keys without which nothing can be built -> what to set
REQUIRED_KEYS = {
    "work_dir": "set work_dir='work_dirs/NAME' in the config or pass --work-dir",
    "model": "set model=dict(type=...)",
}


def prepare_config(cfg: dict, check_device: bool = True) -> tuple[Config, list[str]]:
    """``cfg`` imported, scoped, translated and checked; and one note per iMIX hook translated.

    A :class:`Config` is prepared in place: it is the one the Runner keeps as ``runner.cfg``, file
    name and all. Any other dict (a Ray worker's plain config, or the driver's copy) becomes a new
    Config, so the caller's own stays as it was. ``check_device=False`` is the Ray driver's: the
    device is the workers' to check, and the driver may well have no GPU.

    A config prepared already (it has its settings) is returned as it is: prepared once per
    process, whoever asks again (the Ray worker before its Runner, ``Runner.from_cfg``).
    """
    if isinstance(cfg, Config) and settings_of(cfg) is not None:
        return cfg, list(cfg.__dict__.get(NOTES_ATTR, []))
    cfg = cfg if isinstance(cfg, Config) else Config(to_config_dict(dict(cfg)))
    import_custom_modules(cfg.get("custom_imports"))
    set_default_scope(cfg.get("default_scope"))
    for key, what_to_do in REQUIRED_KEYS.items():
        if cfg.get(key) is None:
            raise ConfigError(key, f"missing: {what_to_do}")
    check_env_cfg(cfg.get("env_cfg"))
    notes = translate_imix_hooks(cfg)
    checked = cfg if check_device else {k: v for k, v in cfg.items() if k != "device"}
    check_config(checked, RUNNER_KEYS, OTHER_CONFIG_KEYS)
    attach_settings(cfg, parse_sections(cfg))
    object.__setattr__(cfg, NOTES_ATTR, tuple(notes))
    return cfg, notes
