"""distributed-runner: a hooked PyTorch training loop that runs the same on a laptop and on Ray.

This ``__init__`` is the package's top floor: it offers users ``Runner``, ``Config`` and
``__version__`` (``from distributed_runner import Runner``) and nothing inside the package imports
those names from it. Python runs this file before any submodule (``from distributed_runner import
dist`` or ``import distributed_runner.registry``, as ``hooks`` does), so at module level it imports
only :mod:`.version`, which imports nothing; ``Runner`` and ``Config`` are imported on first use
(PEP 562 ``__getattr__``). Importing the Runner eagerly here would make every leaf import the
Runner and, through its hook builder, ``hooks`` — which is being imported at that moment.
``tests/unit/test_import_layers.py`` checks both rules.
"""

from __future__ import annotations

from typing import Any

from .version import __version__

__all__ = ["Config", "Runner", "__version__"]


def __getattr__(name: str) -> Any:
    """``Runner`` and ``Config`` on first use; see the module docstring for why not eagerly."""
    if name == "Runner":
        from .runner import Runner

        return Runner
    if name == "Config":
        from .config import Config

        return Config
    raise AttributeError(f"module 'distributed_runner' has no attribute {name!r}")
