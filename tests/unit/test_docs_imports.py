"""Every import path the documentation shows resolves, at its current place (issue 35).

Read from README.md, CONTRIBUTING.md and docs/**/*.md: import statements of ``distributed_runner``
and ``hooks`` in code blocks, the API pages' ``::: dotted.path`` inserts, ``type='...'`` strings
and dotted names in backticks (``distributed_runner.engine.loops``). Each must import — a module,
or a module's attribute — without the DeprecationWarning of a 0.1 name that moved: the docs show
where things are, not where they were.
"""
from __future__ import annotations

import ast
import importlib
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("distributed_runner", "hooks")
DOTTED = r"(?:distributed_runner|hooks)(?:\.[A-Za-z_]\w*)*"
IMPORT_LINE = re.compile(rf"^\s*(from {DOTTED} import .*|import {DOTTED}.*)$")
API_INSERT = re.compile(rf"^:::\s+({DOTTED})\s*$")
TYPE_STRING = re.compile(rf"type\s*=\s*['\"]({DOTTED})['\"]")
BACKTICKED = re.compile(rf"`({DOTTED})`")


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _imports_in(line: str) -> list[str]:
    """The dotted paths an import line names (``from m import a, b`` -> m.a, m.b)."""
    statement = line.strip().rstrip("\\").rstrip("(")
    try:
        node = ast.parse(statement).body[0]
    except SyntaxError:
        return []
    if isinstance(node, ast.ImportFrom):
        return [f"{node.module}.{a.name}" for a in node.names if a.name != "*"] or [node.module]
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    return []


def shown_paths() -> dict[str, str]:
    """Dotted path -> where the docs first show it."""
    found: dict[str, str] = {}
    for path in _doc_files():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            names = []
            if match := IMPORT_LINE.match(line):
                names += _imports_in(match.group(1))
            if match := API_INSERT.match(line.strip()):
                names.append(match.group(1))
            names += TYPE_STRING.findall(line) + BACKTICKED.findall(line)
            for name in names:
                found.setdefault(name, f"{path.relative_to(ROOT)}:{n}")
    return found


def resolve(dotted: str) -> object:
    """The module ``dotted`` names, or the attribute of its longest importable prefix."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


PATHS = shown_paths()


def test_the_docs_show_import_paths():
    assert len(PATHS) > 30  # the scan reads the pages (a broken pattern would find nothing)
    assert "hooks.Hook" in PATHS and "distributed_runner.Runner" in PATHS


@pytest.mark.parametrize("dotted", sorted(PATHS))
def test_a_path_the_docs_show_imports_where_it_is_now(dotted):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            resolve(dotted)
        except (ImportError, AttributeError, DeprecationWarning) as e:
            pytest.fail(f"{PATHS[dotted]} shows {dotted}: {type(e).__name__}: {e}")
