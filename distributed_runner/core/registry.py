"""Registries: how a config names a class by ``type=``.

Every buildable thing (model, dataset, hook, optimizer, scheduler, metric, loop, log sink, collate
function) lives in one registry. A registry may also fall back to a module (``torch.optim`` for
optimizers, ``torch.optim.lr_scheduler`` for schedulers, ``torch.nn`` for models) so torch's own
classes work by name without the user registering them.

A dotted ``type`` that no registry holds is imported (``type='transformers.GPT2LMHeadModel'``,
``type='timm.create_model'``; :mod:`distributed_runner.core.external`), and a Python config may pass
the class or function itself. Such external callables get their nested ``dict(type=...)`` arguments
built first (``config=dict(type='transformers.GPT2Config', ...)`` arrives as a GPT2Config), since
they cannot build configs themselves; registered classes (ours, MMEngine-style ones) keep receiving
nested dicts unbuilt, as MMEngine's models expect.

``build`` checks the keyword arguments against the constructor's signature *before* calling it, so
an unknown or missing argument is a one-line :class:`ConfigError` naming the config key, not a
``TypeError`` from deep inside a constructor.

Scopes, as MMEngine's: a downstream project makes its own registry under ours,
``Registry('hook', parent=HOOKS, scope='mmdet')`` (the scope defaults to the top-level package of
the module that creates it), and registers into that. ``type='mmdet.Name'`` finds its entry from
any registry of the tree, so two projects may register the same name; a child finds its parent's
entries too. A config's ``default_scope='mmdet'`` makes plain names look in that scope first.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

from distributed_runner.core.errors import ArgumentError, ConfigError, closest, did_you_mean
from distributed_runner.core.external import (
    check_downloads,
    import_path,
    is_import_path,
    is_installed,
    missing_package,
)
from distributed_runner.core.log import LOGGER_NAME
from distributed_runner.core.signatures import accepts, check_arguments

_BUILTIN_PACKAGES = ("hooks", "distributed_runner")
_default_scope: str | None = None


def set_default_scope(scope: str | None) -> None:
    """A config's ``default_scope``: plain names look in that scope's registries first."""
    global _default_scope  # noqa: PLW0603 - one per process, as MMEngine's DefaultScope
    if scope is not None and not isinstance(scope, str):
        raise ConfigError(
            "default_scope", f"expected a scope name such as 'mmdet', got {type(scope).__name__}"
        )
    _default_scope = scope


class Registry:
    """A name -> class (or function) table with optional fallback modules."""

    def __init__(
        self,
        name: str,
        var: str | None = None,
        fallbacks: Iterable[str] = (),
        builtins: Iterable[str] = (),
        *,
        parent: Registry | None = None,
        scope: str | None = None,
        locations: Iterable[str] = (),
    ) -> None:
        self.name = name
        if parent is not None and scope is None:  # MMEngine's rule: the creating package
            scope = sys._getframe(1).f_globals.get("__name__", "").split(".")[0] or None
            if scope is None:
                raise ArgumentError(
                    "scope",
                    f"cannot tell which package creates the child "
                    f"registry {name!r}: pass scope='your_package'",
                )
        self.scope, self.parent = scope, parent
        self._children: dict[str, Registry] = {}
        if parent is not None and scope is not None:
            parent._children[scope] = self
        # the registry's importable name, for error messages
        self.var = var or (f"{name} registry of scope {scope!r}" if parent else name.upper())
        self._locations = tuple(locations)  # a child's modules, imported at its first look-up
        self._table: dict[str, Any] = {}
        self._fallback_names = tuple(fallbacks)
        self._fallback_modules: list[ModuleType] | None = None
        # modules whose import registers the built-in entries: imported at the first look-up,
        # so importing a registry (or ``distributed_runner.engine.hook``) does not import
        # every built-in
        self._builtin_modules = tuple(builtins)
        self._builtins_loaded = not self._builtin_modules

    def _load_builtins(self) -> None:
        if not self._builtins_loaded:
            self._builtins_loaded = True
            for module in self._builtin_modules:
                importlib.import_module(module)
        locations, self._locations = self._locations, ()
        for module in locations:
            try:
                importlib.import_module(module)
            except ImportError as e:  # the project's own entries stay reachable
                logging.getLogger(LOGGER_NAME).warning(
                    "%s: cannot import %s (%s)", self.var, module, e
                )

    def _root(self) -> Registry:
        return self if self.parent is None else self.parent._root()

    def _subtree(self) -> Iterator[Registry]:
        """This registry and every registry under it, depth first."""
        yield self
        for child in self._children.values():
            yield from child._subtree()

    def _in_scope(self, scope: str) -> Registry | None:
        """The registry of ``scope`` in this registry's tree (depth first), or None."""
        return next((r for r in self._subtree() if r.scope == scope), None)

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, {len(self._table)} entries)"

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None

    def keys(self) -> list[str]:
        self._load_builtins()
        return sorted(self._table)

    def register_module(
        self, name: str | None = None, force: bool = False, module: Any = None
    ) -> Any:
        """Register ``module`` (or decorate a class/function) under ``name`` or its ``__name__``.

        ``force=True`` replaces an existing entry; otherwise a second registration of a different
        object under the same name is an error (two plugins fighting over a name should be loud) —
        except that a user's class replaces a *built-in* of the same name (from ``hooks`` or
        ``distributed_runner``), with a log line: the seeds' ``CheckInvalidLossHook`` example, which
        we also ship, must keep working as written.
        """
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{self.name} registry: name must be a str, got {type(name).__name__}")

        def _register(obj: Any) -> Any:
            key = name or obj.__name__
            existing = self._table.get(key)
            if existing is not None and existing is not obj and not force:
                # Re-importing a module (e.g. a config's custom_imports run twice) re-creates the
                # class; treat a same-named class from the same module as the same registration.
                same_origin = getattr(existing, "__module__", None) == getattr(
                    obj, "__module__", 1
                ) and getattr(existing, "__qualname__", None) == getattr(obj, "__qualname__", 2)
                builtin = _is_builtin(existing)
                if not same_origin and _is_builtin(obj) and not builtin:
                    return obj  # built-ins loaded after the user's replacement: the user's stays
                if builtin and not same_origin:
                    logging.getLogger(LOGGER_NAME).info(
                        "%s registry: %s.%s replaces the built-in %r",
                        self.name,
                        getattr(obj, "__module__", "?"),
                        getattr(obj, "__qualname__", key),
                        key,
                    )
                elif not same_origin:
                    raise KeyError(
                        f"{key!r} is already registered in the {self.name} registry "
                        f"(by {existing.__module__}); pass force=True to replace it"
                    )
            self._table[key] = obj
            return obj

        if module is not None:
            return _register(module)
        return _register

    def _fallbacks(self) -> list[ModuleType]:
        if self._fallback_modules is None:
            self._fallback_modules = [importlib.import_module(m) for m in self._fallback_names]
        return self._fallback_modules

    def get(self, name: str) -> Any:
        """The registered object (``'scope.Name'``: in that scope's registry), or one from the
        fallback modules or the parent registry, or None. With a ``default_scope``, a plain name
        is looked up in that scope's registry first."""
        scope, dot, short = name.partition(".")
        if dot:
            target = self._root()._in_scope(scope)
            return target.get(short) if target is not None else None
        if _default_scope is not None and self.parent is None:
            scoped = self._in_scope(_default_scope)
            obj = scoped._get_here(name) if scoped not in (None, self) else None
            if obj is not None:
                return obj
        obj = self._get_here(name)
        if obj is None and self.parent is not None:
            return self.parent.get(name)
        return obj

    def _get_here(self, name: str) -> Any:
        obj = self._table.get(name)
        if obj is not None:
            return obj
        if not self._builtins_loaded or self._locations:
            self._load_builtins()
            return self._get_here(name)
        for mod in self._fallbacks():
            obj = getattr(mod, name, None)
            if obj is not None and callable(obj):
                return obj
        return None

    def _own_names(self) -> set[str]:
        self._load_builtins()
        names = set(self._table)
        for mod in self._fallbacks():
            names.update(n for n in dir(mod) if n[:1].isupper())
        return names

    def _known_names(self) -> list[str]:
        """What a config could name from here: this registry's and its parents' entries, and
        every scoped entry of the tree as ``'scope.Name'``."""
        names: set[str] = set()
        registry: Registry | None = self
        while registry is not None:
            names |= registry._own_names()
            registry = registry.parent
        for scoped in self._root()._subtree():
            if scoped.parent is not None:
                names.update(f"{scoped.scope}.{n}" for n in scoped._table)
        return sorted(names)

    def resolve(self, type_: Any, key: str) -> Any:
        """Turn a ``type=`` value (a name or a class) into the class, or raise a one-line error."""
        if not isinstance(type_, str):
            if callable(type_):
                return type_
            raise ConfigError(
                f"{key}.type", f"expected a registered name or a class, got {type(type_).__name__}"
            )
        obj = self.get(type_)
        if obj is not None:
            return obj
        known = self._known_names()
        if is_import_path(type_) and self._root()._in_scope(type_.partition(".")[0]) is None:
            if is_installed(type_):
                return import_path(type_, f"{key}.type")
            # a misspelled scoped name ('mmdet.Foo') says so instead
            if not closest(type_, [n for n in known if "." in n]):
                raise missing_package(type_, f"{key}.type")
        raise ConfigError(
            f"{key}.type",
            f"unknown {self.name} {type_!r}{did_you_mean(type_, known)}; register it with "
            f"@{self.var}.register_module() and list its module in custom_imports, or give "
            f"its import path (type='package.module.Name')",
        )

    def is_registered(self, obj: Any) -> bool:
        """Whether ``obj`` is an entry of this registry's tree, or one of the project's own
        (whose nested configs stay unbuilt: they build them themselves)."""
        if _is_builtin(obj):
            return True
        return any(
            obj is entry
            for registry in self._root()._subtree()
            for entry in registry._table.values()
        )

    def _build_nested(self, value: Any, key: str) -> Any:
        """``value`` with every ``dict(type=...)`` in it (in lists and tuples too) built, for an
        external callable."""
        if isinstance(value, dict) and "type" in value:
            return self.build(value, key)
        if isinstance(value, (list, tuple)) and any(isinstance(v, dict) for v in value):
            return type(value)(self._build_nested(v, f"{key}[{i}]") for i, v in enumerate(value))
        return value

    def build(
        self,
        cfg: Any,
        key: str | None = None,
        default_args: dict | None = None,
        **more_default_args: Any,
    ) -> Any:
        """Build ``cfg`` (a dict with ``type``), passing the default arguments where the class
        takes them; ``key`` is the config path errors name. MMEngine's call shape works too
        (``MODELS.build(dict(type=...), default_args=dict(...))`` inside a hook): without a key,
        errors name ``<REGISTRY>.build(type=...)``.

        Anything that is not a dict (an already-built object) is returned unchanged.
        """
        if not isinstance(cfg, dict):
            return cfg
        if key is None:
            key = f"{self.var}.build(type={cfg.get('type')!r})"
        default_args = {**(default_args or {}), **more_default_args}
        if "type" not in cfg:
            raise ConfigError(
                key,
                f"missing 'type': name a registered {self.name} (e.g. type={self._example()!r})",
            )
        args = {k: v for k, v in cfg.items() if k != "type"}
        cls = self.resolve(cfg["type"], key)
        if not self.is_registered(cls):  # an external callable: nested configs built first
            check_downloads(args, key)
            args = {k: self._build_nested(v, f"{key}.{k}") for k, v in args.items()}
        for k, v in default_args.items():
            if accepts(cls, k):
                args.setdefault(k, v)
        check_arguments(cls, args, key)
        try:
            return cls(**args)
        except ArgumentError as e:  # keyed relative to the object: put the real path in front
            raise e.under(key) from e
        except ConfigError:
            raise
        except (ValueError, TypeError) as e:
            # a constructor rejecting its arguments is a config mistake; `drun --debug` shows
            # the traceback kept in __cause__
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(
                key, f"{getattr(cls, '__name__', cls)}(...) rejected its arguments: {reason}"
            ) from e
        except Exception as e:  # anything else the user's constructor raised
            raise ConfigError(
                key,
                f"{getattr(cls, '__name__', cls)}(...) raised "
                f"{type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else '(no message)'} "
                f"(drun --debug shows where)",
            ) from e

    def _example(self) -> str:
        return next(iter(self._table), "...")


def _is_builtin(obj: Any) -> bool:
    return str(getattr(obj, "__module__", "")).split(".")[0] in _BUILTIN_PACKAGES


# One registry per kind of thing a config can name. HOOKS is re-exported as ``hooks.HOOKS``.
MODELS = Registry(
    "model",
    "MODELS",
    fallbacks=["torch.nn"],
    builtins=[
        "distributed_runner.model.averaged",
        "distributed_runner.model.tta",
        "distributed_runner.model.classifier",
        "distributed_runner.model.hf_model",
    ],
)
DATASETS = Registry("dataset", "DATASETS", builtins=["distributed_runner.data.streaming.shards"])
TRANSFORMS = Registry("transform", "TRANSFORMS", builtins=["distributed_runner.model.tta"])
COLLATE_FUNCTIONS = Registry(
    "collate_fn", "COLLATE_FUNCTIONS", builtins=["distributed_runner.data.loaders"]
)
DATA_SAMPLERS = Registry(
    "sampler",
    "DATA_SAMPLERS",
    fallbacks=["torch.utils.data"],
    builtins=["distributed_runner.data.loaders"],
)
OPTIMIZERS = Registry("optimizer", "OPTIMIZERS", fallbacks=["torch.optim"])
OPTIM_WRAPPERS = Registry(
    "optim_wrapper", "OPTIM_WRAPPERS", builtins=["distributed_runner.optim.wrapper"]
)
OPTIM_WRAPPER_CONSTRUCTORS = Registry(
    "optim_wrapper_constructor",
    "OPTIM_WRAPPER_CONSTRUCTORS",
    builtins=["distributed_runner.optim.constructor"],
)
PARAM_SCHEDULERS = Registry(
    "param_scheduler",
    "PARAM_SCHEDULERS",
    fallbacks=["torch.optim.lr_scheduler"],
    builtins=["distributed_runner.optim.schedulers"],
)
METRICS = Registry(
    "metric",
    "METRICS",
    builtins=["distributed_runner.evaluation.evaluator", "distributed_runner.evaluation.lm_metric"],
)
LOOPS = Registry("loop", "LOOPS", builtins=["distributed_runner.engine.loops"])
HOOKS = Registry("hook", "HOOKS", builtins=["hooks.builtin"])
LOG_SINKS = Registry("log_sink", "LOG_SINKS", builtins=["distributed_runner.tracking.sinks"])
