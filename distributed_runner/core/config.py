"""Config files: Python or YAML, ``_base_`` inheritance, ``--cfg-options`` overrides, custom
imports.

* A Python config is executed; its public top-level variables (not modules, functions or classes)
  become the config. A YAML config is one mapping.
* ``_base_ = 'base.py'`` (or a list) merges the named files first, paths relative to the config;
  the config's own values deep-merge over them. A dict with ``_delete_=True`` replaces the base's
  dict instead of merging into it.
* ``--cfg-options a.b.c=1 x=[1,2] hooks.0.interval=5`` sets dotted keys (list items by index);
  values are Python literals, else plain strings.
* ``custom_imports = dict(imports=['my_pkg.my_hooks'])`` imports the user's modules so their
  ``@HOOKS.register_module()`` (etc.) decorators run. :func:`import_custom_modules` runs where a
  config is loaded or turned into objects, and nowhere else: :meth:`Config.fromfile` (as MMEngine
  does) and :func:`~distributed_runner.engine.config_prep.prepare_config`, which ``Runner.from_cfg``
  (in a plain process and on every Ray worker, which never loaded the file) and the Ray driver's
  ``validate_config`` share.
"""

from __future__ import annotations

import ast
import copy
import importlib
import json
import os
import pprint
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from distributed_runner.core.errors import ConfigError

BASE_KEY = "_base_"
DELETE_KEY = "_delete_"


class ConfigDict(dict):
    """A dict whose keys also read as attributes (``cfg.train_cfg.max_epochs``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __deepcopy__(self, memo: dict) -> ConfigDict:
        return type(self)(copy.deepcopy(dict(self), memo))


def to_config_dict(obj: Any) -> Any:
    """Recursively turn dicts into ConfigDicts (lists and tuples keep their type)."""
    if isinstance(obj, dict):
        return ConfigDict({k: to_config_dict(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return [to_config_dict(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_config_dict(v) for v in obj)
    return obj


def to_plain(obj: Any) -> Any:
    """Recursively turn ConfigDicts into plain dicts (what travels to Ray workers)."""
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_plain(v) for v in obj)
    return obj


def merge(base: Any, override: Any) -> Any:
    """Deep-merge ``override`` into a copy of ``base``; ``_delete_=True`` replaces instead."""
    if not isinstance(base, dict) or not isinstance(override, dict):
        return copy.deepcopy(override)
    if override.get(DELETE_KEY):
        return {k: copy.deepcopy(v) for k, v in override.items() if k != DELETE_KEY}
    out = copy.deepcopy(base)
    for k, v in override.items():
        out[k] = merge(out[k], v) if k in out else strip_delete(copy.deepcopy(v))
    return out


def strip_delete(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: strip_delete(v) for k, v in obj.items() if k != DELETE_KEY}
    return obj


def _read_python(path: Path) -> dict:
    namespace: dict[str, Any] = {"__file__": str(path), "__name__": "__config__"}
    try:
        code = compile(path.read_text(), str(path), "exec")
    except SyntaxError as e:
        raise ConfigError(str(path), f"syntax error on line {e.lineno}: {e.msg}") from None
    try:
        exec(code, namespace)  # the config is the user's own code, like MMEngine's .py configs
    except Exception as e:  # a config that raises is the user's to fix: one line
        line = _failing_line(e, str(path))
        raise ConfigError(
            str(path),
            f"raised {type(e).__name__}"
            f"{f' on line {line}' if line else ''}: "
            f"{str(e).splitlines()[0] if str(e) else ''}".rstrip(": "),
        ) from e
    return {
        k: v
        for k, v in namespace.items()
        if (not k.startswith("_") or k == BASE_KEY)
        and not isinstance(v, (types.ModuleType, types.FunctionType, type))
    }


def _failing_line(exc: BaseException, filename: str) -> int | None:
    """The line of ``filename`` where ``exc`` was raised (its innermost frame there)."""
    tb, line = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _read_yaml(path: Path) -> dict:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(str(path), f"not valid YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "a YAML config must be a mapping of keys to values")
    return data


def _load_raw(path: Path, seen: tuple[Path, ...]) -> dict:
    if not path.is_file():
        raise ConfigError(str(path), "config file not found: check the path")
    if path in seen:
        raise ConfigError(str(path), "_base_ cycle: " + " -> ".join(str(p) for p in (*seen, path)))
    suffix = path.suffix.lower()
    if suffix == ".py":
        data = _read_python(path)
    elif suffix in (".yaml", ".yml"):
        data = _read_yaml(path)
    else:
        raise ConfigError(str(path), "unsupported config type: use a .py, .yaml or .yml file")
    bases = data.pop(BASE_KEY, None)
    if bases is None:
        return data
    merged: dict = {}
    for base in [bases] if isinstance(bases, str) else list(bases):
        merged = merge(merged, _load_raw((path.parent / base).resolve(), (*seen, path)))
    return merge(merged, data)


def _git_commit(folder: Path) -> str | None:
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


class Config(ConfigDict):
    """A loaded config; ``filename`` is where it came from (None for one built from a dict)."""

    @classmethod
    def fromfile(
        cls,
        path: str | os.PathLike,
        cfg_options: Iterable[str] | dict | None = None,
        import_custom: bool = True,
    ) -> Config:
        """Load ``path`` (with its ``_base_`` files), apply ``cfg_options``, import custom
        modules."""
        path = Path(path).expanduser().resolve()
        cfg = cls(to_config_dict(_load_raw(path, ())))
        object.__setattr__(cfg, "_filename", str(path))
        if cfg_options:
            cfg.apply_options(cfg_options)
        if import_custom:
            import_custom_modules(cfg.get("custom_imports"))
        return cfg

    @property
    def filename(self) -> str | None:
        return getattr(self, "_filename", None)

    @property
    def git_commit(self) -> str | None:
        """The commit of the git checkout holding the config file (None outside one). Ray workers
        get the driver's answer (:meth:`with_source`): the file may not exist on their node."""
        if not hasattr(self, "_git_commit"):
            object.__setattr__(
                self,
                "_git_commit",
                _git_commit(Path(self.filename).parent) if self.filename else None,
            )
        return self._git_commit

    def source(self) -> dict:
        """Where the config came from, as plain data a Ray worker can be given."""
        return {"filename": self.filename, "git_commit": self.git_commit}

    def with_source(self, source: dict | None) -> Config:
        """Adopt a :meth:`source` computed elsewhere (on the driver); returns self."""
        if source:
            object.__setattr__(self, "_filename", source.get("filename"))
            object.__setattr__(self, "_git_commit", source.get("git_commit"))
        return self

    def __getattr__(self, name: str) -> Any:
        if name in ("_filename", "_git_commit"):
            raise AttributeError(name)
        return super().__getattr__(name)

    def apply_options(self, options: Iterable[str] | dict) -> None:
        """Set dotted keys: ``['a.b=1', 'x=[1,2]']`` or ``{'a.b': 1}``."""
        pairs = (
            options.items() if isinstance(options, dict) else (_split_option(o) for o in options)
        )
        for dotted, value in pairs:
            set_dotted(self, dotted, value)

    def to_dict(self) -> dict:
        return to_plain(self)

    def pretty_text(self) -> str:
        """The config as a Python file (what ``work_dir/config.py`` holds)."""
        return (
            "\n".join(
                f"{k} = {pprint.pformat(v, sort_dicts=False, width=100)}"
                for k, v in to_plain(self).items()
            )
            + "\n"
        )


def _split_option(option: str) -> tuple[str, Any]:
    if "=" not in option:
        raise ConfigError(
            "--cfg-options", f"{option!r} is not KEY=VALUE (e.g. train_cfg.max_epochs=5)"
        )
    key, raw = option.split("=", 1)
    key, raw = key.strip(), raw.strip()
    parts = key.split(".")
    if not key or any(not p for p in parts):
        raise ConfigError("--cfg-options", f"{option!r} has an empty key part: write a.b.c=VALUE")
    if any(p.startswith("__") for p in parts):
        raise ConfigError("--cfg-options", f"{key!r}: names starting with '__' are not config keys")
    value = parse_value(raw)
    closing = {"[": "]", "(": ")", "{": "}"}
    if isinstance(value, str) and raw[:1] in closing and not raw.endswith(closing[raw[0]]):
        raise ConfigError(
            "--cfg-options",
            f"{key}={raw}: the value opens {raw[0]!r} but does "
            f"not close it (quote the whole option in the shell)",
        )
    return key, value


def parse_value(raw: str) -> Any:
    """A Python literal if it is one (``5``, ``[1,2]``, ``'x'``), ``true/false/null``, else the
    string."""
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        pass
    if raw.startswith(("[", "(")) and raw.endswith(("]", ")")):  # [a,b] without quotes
        items = [parse_value(x.strip()) for x in raw[1:-1].split(",") if x.strip()]
        return items if raw.startswith("[") else tuple(items)
    return raw


def set_dotted(cfg: dict, dotted: str, value: Any) -> None:
    """``set_dotted(cfg, 'a.b.0.c', v)``: create dicts on the way; index into existing lists."""
    parts = dotted.split(".")
    node: Any = cfg
    for part in parts[:-1]:
        node = _child(node, part, dotted, create=True)
    last = parts[-1]
    if isinstance(node, list):
        try:
            node[int(last)] = to_config_dict(value)
        except (ValueError, IndexError):
            raise ConfigError(
                dotted, f"{last!r} is not an index of a list of {len(node)}"
            ) from None
    elif isinstance(node, dict):
        node[last] = to_config_dict(value)
    else:
        raise ConfigError(dotted, f"cannot set {last!r} inside a {type(node).__name__}")


def _child(node: Any, part: str, dotted: str, create: bool) -> Any:
    if isinstance(node, list):
        try:
            return node[int(part)]
        except (ValueError, IndexError):
            raise ConfigError(
                dotted, f"{part!r} is not an index of a list of {len(node)}"
            ) from None
    if isinstance(node, dict):
        if part not in node or node[part] is None:
            if not create:
                raise ConfigError(dotted, f"no key {part!r}")
            node[part] = ConfigDict()
        return node[part]
    raise ConfigError(dotted, f"cannot descend into a {type(node).__name__} at {part!r}")


def import_custom_modules(custom_imports: Any) -> list[types.ModuleType]:
    """Import the modules in ``custom_imports`` (dict(imports=[...]) or a list of names)."""
    if not custom_imports:
        return []
    allow_failed = False
    if isinstance(custom_imports, dict):
        names = custom_imports.get("imports", [])
        allow_failed = bool(custom_imports.get("allow_failed_imports", False))
    else:
        names = custom_imports
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ConfigError(
            "custom_imports",
            f"takes dict(imports=['my_pkg.my_module', ...]) or a list of module names, got "
            f"{custom_imports!r}",
        )
    if os.getcwd() not in sys.path:  # a console script does not put the cwd on sys.path
        sys.path.insert(0, os.getcwd())
    modules = []
    for name in names:
        try:
            modules.append(importlib.import_module(name))
        except ImportError as e:
            if allow_failed:
                continue
            raise ConfigError(
                "custom_imports.imports",
                f"cannot import {name!r} ({e}); check the module name and that its "
                f"folder is on PYTHONPATH",
            ) from None
    return modules


def dumps_json(cfg: Any) -> str:
    """The config as JSON text (non-JSON values as their repr), as stored in checkpoint meta."""
    return json.dumps(to_plain(cfg), default=repr, sort_keys=False)


def runs_in_process(launcher: Any) -> bool:
    """Whether a config's ``launcher`` value names the single-process path (``None``, ``'none'``
    or ``dict(type='none')``) rather than Ray; the launcher checks the rest of the value."""
    return (
        launcher is None
        or launcher == "none"
        or (isinstance(launcher, dict) and launcher.get("type") == "none")
    )
