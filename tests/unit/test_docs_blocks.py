"""Every fenced block of the documentation is tested or says why not, and the docs hang together.

The rule (``tests/docs_blocks.py``): a block has ``<!-- docs-test: NAME -->`` or
``<!-- docs-skip: REASON -->`` on the line before it; every ``docs-test`` name is read by some
test, so a new example fails here until a test runs it or it says why it is not run.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from tests.docs_blocks import ROOT, all_blocks, doc_files

HELPERS = ("docs_block", "docs_commands")
# the pages docs/gen_reference.py adds at build time (its PAGES; asserted there too)
GENERATED = {"reference/config.md", "reference/hooks.md", "reference/cli.md"}


def test_every_block_is_marked_tested_or_skipped_with_a_reason():
    unmarked = [b.where() for b in all_blocks() if b.kind is None]
    assert not unmarked, ("blocks without <!-- docs-test: NAME --> or <!-- docs-skip: REASON --> "
                          f"on the line before them: {unmarked}")
    for block in all_blocks():
        assert block.label, f"{block.where()}: the marker names no test or reason"
        if block.kind == "test":
            assert re.fullmatch(r"[a-z0-9-]+", block.label), block.where()


def test_docs_test_names_are_unique():
    seen: dict[str, str] = {}
    for block in all_blocks():
        if block.kind == "test":
            assert block.label not in seen, f"{block.label!r} at {seen.get(block.label)} " \
                                            f"and {block.where()}"
            seen[block.label] = block.where()


def _test_sources() -> dict[Path, ast.AST]:
    skip = {ROOT / "tests" / "docs_blocks.py", Path(__file__).resolve()}
    return {p: ast.parse(p.read_text()) for p in sorted((ROOT / "tests").rglob("*.py"))
            if p not in skip}


def test_every_docs_test_name_is_used_by_a_test():
    strings = {node.value for tree in _test_sources().values() for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    unused = sorted(b.where() + " " + b.label for b in all_blocks()
                    if b.kind == "test" and b.label not in strings)
    assert not unused, f"docs-test blocks no test reads: {unused}"


def test_every_name_a_test_reads_is_in_the_docs():
    names = {b.label for b in all_blocks() if b.kind == "test"}
    for path, tree in _test_sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in HELPERS \
                    and node.args and isinstance(node.args[0], ast.Constant):
                assert node.args[0].value in names, f"{path.name}: {node.args[0].value!r}"


def test_the_marker_scheme_finds_blocks_in_lists_and_ignores_inline_code(tmp_path):
    from tests import docs_blocks

    page = tmp_path / "page.md"
    page.write_text("Text with ```inline``` code.\n\n- item\n\n  <!-- docs-skip: sample -->\n"
                    "  ```text\n  out\n  ```\n\n```python\nx = 1\n```\n")
    found = docs_blocks.blocks_of(page)
    assert [(b.kind, b.label, b.code) for b in found] == [("skip", "sample", "out\n"),
                                                           (None, "", "x = 1\n")]


def _nav_files(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [f for value in node.values() for f in _nav_files(value)]
    return [f for item in node for f in _nav_files(item)]


def test_every_page_is_in_the_menu_and_every_menu_entry_exists():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = set(_nav_files(config["nav"]))
    docs = ROOT / "docs"
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}
    assert pages - nav == set()
    assert nav - pages == GENERATED


def test_the_readme_is_the_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file() or target.removeprefix("docs/") in GENERATED, target
    # imix_compat's error messages send users to "the README's iMIX table ('MMEngine and iMIX
    # users')": the README's section of that name links to the page that holds the table
    section = readme.split("\n## MMEngine and iMIX users\n", 1)[1].split("\n## ", 1)[0]
    assert "docs/how-to/mmengine-imix.md" in section
    page = (ROOT / "docs" / "how-to" / "mmengine-imix.md").read_text()
    assert "| iMIX | here |" in page


def test_every_doc_file_is_scanned():
    files = {p.relative_to(ROOT).as_posix() for p in doc_files()}
    assert {"README.md", "CONTRIBUTING.md", "docs/index.md"} <= files


def test_every_table_column_in_the_docs_and_the_readme_has_a_header():
    """A Markdown table's header row names every column (an empty header cell reads as a
    broken table)."""
    import re

    separator = re.compile(r"\|(\s*:?-+:?\s*\|)+")
    missing = []
    for page in [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]:
        lines = page.read_text().splitlines()
        for number, (line, following) in enumerate(zip(lines, lines[1:]), start=1):
            if line.strip().startswith("|") and separator.fullmatch(following.strip()):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if "" in cells:
                    missing.append(f"{page.relative_to(ROOT)}:{number}")
    assert missing == []
