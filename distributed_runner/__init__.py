"""distributed-runner: a hooked PyTorch training loop that runs the same on a laptop and on Ray.

``Runner`` and ``Config`` are loaded on first use (PEP 562), so importing a leaf module such as
``distributed_runner.registry`` or ``distributed_runner.dist`` — which ``hooks`` does — never
imports the Runner and, through it, every built-in hook.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["Config", "Runner", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Runner":
        from .runner import Runner
        return Runner
    if name == "Config":
        from .config import Config
        return Config
    raise AttributeError(f"module 'distributed_runner' has no attribute {name!r}")
