"""Classes and factories a config names by import path: ``type='transformers.GPT2LMHeadModel'``,
``type='timm.create_model'``, ``type='torch.nn.Linear'``.

:meth:`Registry.resolve <distributed_runner.core.registry.Registry.resolve>` comes here for a dotted
``type`` that no registry holds (registered names, MMEngine's scoped ``'mmpretrain.ResNet'``
included, always win). The path is imported the way Python would: the top-level package, then
each further part as an attribute (importing it as a submodule when it is not one yet), so a
misspelled part, a package that is not installed or a package that fails to import is one line
naming the config key, with what to install or the closest names.

Downloads: these callables can fetch weights (``pretrained=True``, ``from_pretrained``). A
machine without network would hang in a retry loop, so before importing a Hugging Face package
``HF_HUB_OFFLINE`` defaults to ``1`` (the user's own setting wins; it must be set before the
package is first imported to count), and while it is on, ``pretrained=True`` in such a config is
a one-line error instead of a download attempt.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType
from typing import Any

from distributed_runner.core.errors import ConfigError, closest

# packages whose pretrained weights come from the Hugging Face hub: offline by default
HUB_PACKAGES = frozenset(
    {
        "transformers",
        "timm",
        "diffusers",
        "peft",
        "huggingface_hub",
        "sentence_transformers",
        "open_clip",
    }
)
# packages an extra of ours installs: the error says so
EXTRAS = {"transformers": "hf"}


def is_import_path(name: str) -> bool:
    """Whether ``name`` looks like ``package.attr[.attr...]`` (identifiers joined by dots)."""
    parts = name.split(".")
    return len(parts) > 1 and all(p.isidentifier() for p in parts)


def is_installed(path: str) -> bool:
    """Whether the top-level package of ``path`` can be imported (found without importing it)."""
    try:
        return importlib.util.find_spec(path.split(".")[0]) is not None
    except (ImportError, ValueError):
        return False


def offline() -> bool:
    """Whether hub downloads are off (``HF_HUB_OFFLINE`` set to a true value)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def missing_package(path: str, key: str) -> ConfigError:
    """The one-line error for a path whose top-level package is not installed."""
    top = path.split(".")[0]
    extra = f" (or distributed-runner[{EXTRAS[top]}])" if top in EXTRAS else ""
    return ConfigError(
        key,
        f"cannot import {path!r}: no module named {top!r}; "
        f"pip install {top.replace('_', '-')}{extra}",
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _import(name: str, path: str, key: str) -> ModuleType | None:
    """Module ``name`` imported; None when it does not exist (a missing ``name`` itself, not
    something it imports); any other import failure is the config's error."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name == name:
            return None
        raise ConfigError(
            key, f"cannot import {path!r}: importing {name} failed: {_first_line(e)}"
        ) from e
    except Exception as e:  # a package broken at import: one line, cause kept
        raise ConfigError(
            key, f"cannot import {path!r}: importing {name} failed: {_first_line(e)}"
        ) from e


def import_path(path: str, key: str) -> Any:
    """The object ``path`` names (see the module docstring); ``key`` is the config key errors
    name (``model.type``)."""
    top, *rest = path.split(".")
    if top in HUB_PACKAGES:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    obj: Any = _import(top, path, key)
    if obj is None:
        raise missing_package(path, key)
    done = top
    for part in rest:
        try:
            found = getattr(obj, part)
        except AttributeError:
            found = None
        except Exception as e:  # a lazy attribute whose import failed
            raise ConfigError(
                key, f"cannot import {path!r}: {done}.{part}: {_first_line(e)}"
            ) from e
        if found is None and isinstance(obj, ModuleType):
            found = _import(f"{done}.{part}", path, key)
        if found is None:
            names = [n for n in dir(obj) if not n.startswith("_")]
            hits = closest(part, names, n=1)
            hint = f"; did you mean {hits[0]!r}?" if hits else ""
            raise ConfigError(
                key, f"cannot import {path!r}: {done} has no attribute {part!r}{hint}"
            )
        obj, done = found, f"{done}.{part}"
    return obj


def check_downloads(args: dict, key: str) -> None:
    """``pretrained=True`` while downloads are off: one line, not a hang in a retry loop."""
    if args.get("pretrained") is True and offline():
        raise ConfigError(
            f"{key}.pretrained",
            "True downloads weights, and this run is "
            "offline (HF_HUB_OFFLINE=1, the default for hub packages here): set "
            "pretrained=False and load weights with load_from=... (or the "
            "factory's checkpoint_path=...), or set HF_HUB_OFFLINE=0 where the "
            "network is reachable",
        )
