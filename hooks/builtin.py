"""Importing this module registers every built-in hook in ``HOOKS`` (the registry does it at its
first look-up; nothing else needs to import it)."""

from __future__ import annotations

import importlib

from hooks.builtin_names import BUILTIN_HOOKS

for _module in dict.fromkeys(BUILTIN_HOOKS.values()):
    importlib.import_module(f"hooks.{_module}")
