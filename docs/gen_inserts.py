"""Generated text for the hand-written pages: ``<!-- insert: NAME ARGS -->`` lines.

``docs/gen_reference.py`` (the MkDocs hook) expands them at every build with :data:`INSERTS`:
``docstring MODULE`` (a module's docstring, or a file's such as ``tests/unit/x.py``, its Sphinx
markup turned into Markdown), ``mount-points`` (read from ``hooks.Hook``), ``checkpoint-parts``
(``checkpoint_parts.PARTS``) and ``modules PACKAGE`` (each module's first docstring line).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


_ROLES = ("class", "func", "meth", "mod", "data", "attr", "exc", "obj")
_ROLE = re.compile(r":(?:" + "|".join(_ROLES) + r"):`~?([^`<]*?)(?: <[^`]*>)?`")


def _inline(text: str) -> str:
    text = _ROLE.sub(lambda m: "``" + (m.group(1).split(".")[-1] if m.group(0).startswith(
        tuple(f":{r}:`~" for r in _ROLES)) else m.group(1)) + "``", text)
    return re.sub(r"``([^`]+?)``", r"`\1`", text)


def rst_to_markdown(doc: str) -> str:
    """A docstring's Sphinx markup as Markdown: roles and ````x```` become code (also across a
    line break), a paragraph ending in ``::`` introduces a fenced code block (left as it is)."""
    lines, out, text, i = doc.splitlines(), [], [], 0
    while i < len(lines):
        line = lines[i]
        if not line.rstrip().endswith("::"):
            text.append(line)
            i += 1
            continue
        lead = line.rstrip()[:-2].rstrip()
        text.append(lead + ":" if lead.strip() else "")
        out.append(_inline("\n".join(text)))
        text, j, block = [], i + 1, []
        while j < len(lines) and (not lines[j].strip() or lines[j].startswith(" ")):
            block.append(lines[j])
            j += 1
        while block and not block[-1].strip():
            block.pop()
        out += ["", "```text", textwrap.dedent("\n".join(block)).strip("\n"), "```", ""]
        i = j
    out.append(_inline("\n".join(text)))
    return "\n".join(out)


def module_docstring(name: str) -> str:
    """A module's docstring (a dotted module, or a path such as ``tests/unit/x.py``), set apart
    as a quote titled with where it comes from."""
    if name.endswith(".py"):
        doc, where = ast.get_docstring(ast.parse((ROOT / name).read_text())) or "", name
    else:
        doc = inspect.getdoc(importlib.import_module(name)) or ""
        where = name.replace(".", "/") + ".py"
    body = textwrap.indent(rst_to_markdown(doc), "    ", lambda line: bool(line.strip()))
    return f'!!! quote "The docstring of `{where}`"\n\n{body}\n'



def mount_points_table() -> str:
    from hooks.hook import ADDED_MOUNT_POINTS, MOUNT_POINTS, Hook

    out = ["| Mount point | Arguments after `runner` | What the base class says |",
           "|---|---|---|"]
    for name in MOUNT_POINTS:
        params = list(inspect.signature(getattr(Hook, name)).parameters)[2:]
        doc = (inspect.getdoc(getattr(Hook, name)) or "").replace("\n", " ")
        ours = " **(ours, not MMEngine's)**" if name in ADDED_MOUNT_POINTS else ""
        out.append(f"| `{name}`{ours} | {', '.join(f'`{p}`' for p in params) or '—'} | "
                   f"{_cell(rst_to_markdown(doc))} |")
    return "\n".join(out)


def parts_table() -> str:
    from distributed_runner.checkpoint_parts import PARTS

    out = ["| Key | Per rank | What it holds | When it is there | Written by |",
           "|---|---|---|---|---|"]
    out += [f"| `{p.key}` | {'yes' if p.per_rank else ''} | {_cell(p.description)} | "
            f"{_cell(p.present)} | {_cell(p.written_by or 'the Runner')} |" for p in PARTS]
    return "\n".join(out)


def modules_table(package: str) -> str:
    """Each module of ``package`` with the first sentence of its docstring (what it owns)."""
    out = ["| Module | What it owns (its docstring's first line) |", "|---|---|"]
    for path in sorted((ROOT / package).rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = rst_to_markdown(doc.split("\n\n")[0]).replace("\n", " ")
        out.append(f"| `{path.relative_to(ROOT).as_posix()}` | {_cell(first)} |")
    return "\n".join(out)


INSERTS: dict[str, Callable[..., str]] = {
    "docstring": module_docstring, "mount-points": mount_points_table,
    "checkpoint-parts": parts_table, "modules": modules_table}
_INSERT = re.compile(r"^<!-- insert: ([\w-]+)((?: [\w./-]+)*) -->$", re.M)


def expand_inserts(markdown: str) -> str:
    return _INSERT.sub(lambda m: INSERTS[m.group(1)](*m.group(2).split()), markdown)
