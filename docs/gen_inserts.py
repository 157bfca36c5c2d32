"""Generated text for the hand-written pages: ``<!-- insert: NAME ARGS -->`` lines.

``docs/gen_reference.py`` (the MkDocs hook) expands them at every build with :data:`INSERTS`:
``docstring MODULE`` (a module's docstring, or a file's such as ``tests/unit/x.py``, its Sphinx
markup turned into Markdown), ``mount-points`` (read from ``hooks.Hook``), ``checkpoint-parts``
(``distributed_runner.checkpoint.parts.PARTS``), ``modules PACKAGE [LEVEL]`` (each module's first
docstring line, one table per package or subpackage, each under a heading of ``LEVEL``) and
``import-contracts FILE`` (the import-linter contracts of ``FILE``'s ``[tool.importlinter]``:
the layers top down, what each other contract forbids) and ``iteration-files TEST`` (the files
one training iteration runs in, case by case, from the literals ``GROUPS``, ``CASES``,
``ITERATIONS`` and ``ROWS`` of the test that asserts them: ``tests/unit/test_iteration_files.py``).
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    from distributed_runner.engine.hook import ADDED_MOUNT_POINTS, MOUNT_POINTS, Hook

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
    from distributed_runner.checkpoint.parts import PARTS

    out = ["| Key | Per rank | What it holds | When it is there | Written by |",
           "|---|---|---|---|---|"]
    out += [f"| `{p.key}` | {'yes' if p.per_rank else ''} | {_cell(p.description)} | "
            f"{_cell(p.present)} | {_cell(p.written_by or 'the Runner')} |" for p in PARTS]
    return "\n".join(out)


def _first_paragraph(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return rst_to_markdown(doc.split("\n\n")[0]).replace("\n", " ")


def _may_import(path: Path) -> str:
    """The ``May import: ...`` sentence of a package's docstring, or ``''``."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    match = re.search(r"May import:.*?(?:\.(?=\s|$)|$)", doc, re.S)
    return rst_to_markdown(match.group(0)).replace("\n", " ") if match else ""


def modules_table(package: str, level: str = "4") -> str:
    """Each module of ``package`` with the first paragraph of its docstring (what it owns): one
    table for the package's own modules, then, for every subpackage at any depth, a heading of
    ``level`` (``#### `distributed_runner/core/```), what its ``__init__`` says it owns and may
    import, and the table of its modules."""
    top = ROOT / package
    folders = [top, *sorted(p.parent for p in top.rglob("__init__.py") if p.parent != top)]
    out: list[str] = []
    for folder in folders:
        where = folder.relative_to(ROOT).as_posix() + "/"
        if folder != top:
            init = folder / "__init__.py"
            out += [f"{'#' * int(level)} `{where}`", "", _first_paragraph(init)]
            if may := _may_import(init):
                out[-1] += " " + may
            out.append("")
        out += ["| Module | What it owns (its docstring's first paragraph) |", "|---|---|"]
        for path in sorted(folder.glob("*.py")):
            if path.name == "__init__.py" and folder != top:
                continue  # said above the table
            out.append(f"| `{where}{path.name}` | {_cell(_first_paragraph(path))} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _layer(layer: str, container: str) -> str:
    """One layer of a layers contract: ``a | b`` are independent siblings (neither imports the
    other), ``a : b`` siblings that may import each other."""
    prefix = f"{container}." if container else ""
    for sep, note in (("|", " (independent: none imports another)"),
                      (":", " (may import each other)")):
        if sep in layer:
            names = [n.strip() for n in layer.split(sep)]
            return " · ".join(f"`{prefix}{n}`" for n in names) + note
    return f"`{prefix}{layer.strip()}`"


def _names(modules: list[str]) -> str:
    return ", ".join(f"`{m}`" for m in modules)


def _contract(contract: dict[str, Any]) -> list[str]:
    """One import-linter contract as Markdown lines: what it allows or forbids."""
    kind = contract.get("type", "")
    out = [f"**{_cell(contract.get('name', kind))}** (`{kind}`)", ""]
    if kind == "layers":
        containers = contract.get("containers") or [""]
        for container in containers:
            out += ["| | Layer, top down: each imports only from the layers below it |",
                    "|---|---|"]
            out += [f"| {i} | {_layer(layer, container)} |"
                    for i, layer in enumerate(contract["layers"], 1)]
            out.append("")
        if contract.get("exhaustive"):
            out += ["Exhaustive: every subpackage and module of "
                    f"{_names(containers)} is in a layer.", ""]
    elif kind == "acyclic_siblings":
        default = "" if "depth" in contract else ", the default"
        depth = f"to depth {contract.get('depth', 10)}{default}"
        out += [f"No import cycle among the children of any package under "
                f"{_names(contract['ancestors'])} ({depth}; a child counts with all it holds)."]
        if skipped := contract.get("skip_descendants"):
            out[-1] += f" Not below {_names(skipped)}."
        out.append("")
    elif kind == "forbidden":
        alone = contract.get("as_packages") is False  # the modules named, not their submodules
        subs = " (these modules, not their submodules)" if alone else ""
        out += [f"{_names(contract['source_modules'])}{subs} may not import "
                f"{_names(contract['forbidden_modules'])}.", ""]
    elif kind == "independence":
        out += [f"None of {_names(contract['modules'])} imports another.", ""]
    else:
        out += [f"{_cell(key)}: {_cell(value)}" for key, value in contract.items()
                if key not in ("name", "type")] + [""]
    if ignored := contract.get("ignore_imports"):
        out += ["Exceptions: " + _names(ignored) + ".", ""]
    return out


def import_contracts(file: str = "pyproject.toml") -> str:
    """The import-linter contracts of ``file`` (``[tool.importlinter]``), in its order."""
    config = tomllib.loads((ROOT / file).read_text())["tool"]["importlinter"]
    out = [f"Root packages: {_names(config['root_packages'])}.", ""]
    for contract in config["contracts"]:
        out += _contract(contract)
    return "\n".join(out).rstrip() + "\n"


def _literals(file: str, *names: str) -> list[Any]:
    """The values of the module-level assignments ``names`` of ``file``, read without importing
    it (each must be a literal)."""
    values = {}
    for node in ast.parse((ROOT / file).read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in names:
                values[target.id] = ast.literal_eval(node.value)
    return [values[name] for name in names]


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def iteration_files(test: str) -> str:
    """Two tables from ``test``'s literals: for each case (and rank) the groups of files each
    followed iteration runs in, then each group's files and what they do in the iteration."""
    groups, cases, what, rows = _literals(test, "GROUPS", "CASES", "ITERATIONS", "ROWS")
    iterations = sorted(what)
    found = {(case, rank, it): names for case, rank, it, names in rows}
    out = ["| Case | " + " | ".join(f"{_ordinal(i)} iteration ({_cell(what[i])})"
                                    for i in iterations) + " |",
           "|---|" + "---|" * len(iterations)]
    for case, rank in dict.fromkeys((row[0], row[1]) for row in rows):
        label = f"**{case}**: {_cell(cases[case])}" + (f", rank {rank}" if rank is not None else "")
        cells = [" + ".join(f"*{name}*" for name in found[(case, rank, it)])
                 if (case, rank, it) in found else "(not followed)" for it in iterations]
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out += ["", "| Group | Files | What runs there |", "|---|---|---|"]
    for name, (what, files) in groups.items():
        out.append(f"| *{name}* | " + ", ".join(f"`{f}`" for f in files) + f" | {_cell(what)} |")
    return "\n".join(out) + "\n"


INSERTS: dict[str, Callable[..., str]] = {
    "docstring": module_docstring, "mount-points": mount_points_table,
    "checkpoint-parts": parts_table, "modules": modules_table,
    "import-contracts": import_contracts, "iteration-files": iteration_files}
_INSERT = re.compile(r"^<!-- insert: ([\w-]+)((?: [\w./-]+)*) -->$", re.M)


def expand_inserts(markdown: str) -> str:
    return _INSERT.sub(lambda m: INSERTS[m.group(1)](*m.group(2).split()), markdown)
