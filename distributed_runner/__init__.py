"""distributed-runner: a hooked PyTorch training loop that runs the same on a laptop and on Ray.

The package is a stack of subpackages, one concern each, declared top down in ``pyproject.toml``
(import-linter): ``cli``, ``tune``, ``launch``, ``engine``, ``validation``, ``checkpoint``,
then ``optim``, ``evaluation``, ``data`` and ``health`` side by side, ``model``, then
``tracking``, ``compat`` and ``examples``, and ``core`` at the bottom. Each ``__init__`` says what
its subpackage owns and may import.

This ``__init__`` offers users ``Runner``, ``Config`` and ``__version__`` (``from
distributed_runner import Runner``); nothing inside the package imports those names from it.
Python runs it before any submodule, so at module level it imports only :mod:`.version` and
:mod:`.core.moved` (which import nothing of the project) and installs the finder that answers
the 0.1 module names (``distributed_runner.runner`` ...) with their new modules. ``Runner`` and
``Config`` are imported on first use (PEP 562 ``__getattr__``): importing the Runner eagerly
would make every leaf import the Runner and, through its hook builder, ``hooks``.
"""

from __future__ import annotations

from typing import Any

from distributed_runner.core import moved
from distributed_runner.version import __version__

moved.install()  # the 0.1 module names answer with their new modules

__all__ = ["Config", "Runner", "__version__"]


def __getattr__(name: str) -> Any:
    """``Runner`` and ``Config`` on first use; see the module docstring for why not eagerly."""
    if name == "Runner":
        from distributed_runner.engine.runner import Runner

        return Runner
    if name == "Config":
        from distributed_runner.core.config import Config

        return Config
    raise AttributeError(f"module 'distributed_runner' has no attribute {name!r}")
