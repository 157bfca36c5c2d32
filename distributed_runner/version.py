"""The package's version, in a module of its own.

Kept out of ``distributed_runner/__init__.py`` so that modules inside the package (the Runner's
start-up log line, checkpoint metadata) can read it without importing the package ``__init__``:
a leaf importing the top floor back would be an import cycle. pyproject.toml states the same
version (``[project] version``); tests/unit/test_layout.py checks the two agree.
"""

from __future__ import annotations

__version__ = "0.1.0"
