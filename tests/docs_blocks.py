"""The fenced blocks of the documentation, read by their markers.

Every fenced block in ``docs/**/*.md``, ``README.md`` and ``CONTRIBUTING.md`` has, on the line just
before its opening fence, either ``<!-- docs-test: NAME -->`` (a test reads it with
:func:`docs_block` / :func:`docs_commands` and runs it, or runs what it says) or
``<!-- docs-skip: REASON -->`` (not run, and why). ``tests/unit/test_docs_blocks.py`` checks that
every block has one, that names are unique, and that every name is used by some test.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^\s*<!-- docs-(test|skip): (.*?) -->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    kind: str | None  # 'test', 'skip' or None (no marker: an error)
    label: str  # the test's name or the reason to skip
    code: str

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """The Markdown files whose blocks must carry a marker."""
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, language = opening.groups()
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        marker = MARKER.match(lines[i - 1]) if i else None
        code = textwrap.dedent("\n".join(line[len(indent):] if line.startswith(indent) else line
                                         for line in lines[i + 1:end]))
        found.append(Block(path, i + 1, language, marker.group(1) if marker else None,
                           marker.group(2).strip() if marker else "", code + "\n"))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks_of(path)]


def docs_block(name: str) -> str:
    """The code of the one block marked ``<!-- docs-test: NAME -->``."""
    found = [b for b in all_blocks() if b.kind == "test" and b.label == name]
    assert len(found) == 1, f"docs-test {name!r}: {len(found)} blocks carry it " \
                            f"({', '.join(b.where() for b in found)})"
    return found[0].code


def docs_commands(name: str) -> list[str]:
    """A shell block as its commands: continuation lines joined, comments dropped."""
    joined = docs_block(name).replace("\\\n", " ")
    commands = []
    for line in joined.splitlines():
        line = re.split(r"\s+#", line)[0].strip()
        if line and not line.startswith("#"):
            commands.append(" ".join(line.split()))
    return commands


def docs_text() -> str:
    """Every documentation page, as one text (for prose a test quotes)."""
    return "\n".join(path.read_text() for path in doc_files())
