"""The generated reference (``docs/gen_reference.py``) names every registered hook, every config
key and every ``drun`` option, and every insert of the hand-written pages renders.

The docs build runs the same functions (as a MkDocs hook); these tests need no MkDocs."""
from __future__ import annotations

import argparse
import importlib.util
import re
import shlex

import pytest

from tests.docs_blocks import ROOT, docs_block


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_reference",
                                                  ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_pages_are_the_ones_the_menu_expects(gen):
    from tests.unit.test_docs_blocks import GENERATED

    assert set(gen.PAGES) == GENERATED


def test_the_hooks_page_has_every_registered_hook(gen):
    from distributed_runner.core.registry import HOOKS
    from distributed_runner.engine.hook_builder import DEFAULT_HOOKS
    from hooks.builtin_names import BUILTIN_HOOKS

    page = gen.hooks_page()
    names = HOOKS.keys()
    assert set(BUILTIN_HOOKS) <= set(names)
    for name in names:
        assert f"\n### {name}\n" in page, name
    for key in DEFAULT_HOOKS:
        assert f"| `{key}` |" in page, key
    # parameters come from __init__, priorities from the class
    checkpoint = page.split("\n### CheckpointHook\n")[1].split("\n### ")[0]
    assert "`max_keep_ckpts=-1`" in checkpoint and "VERY_LOW (90)" in checkpoint
    assert "`default_hooks.checkpoint` with `{'interval': 1}`" in checkpoint


def test_the_config_page_has_every_key(gen):
    from distributed_runner.engine.config_check import MMCV1_KEYS
    from distributed_runner.engine.config_prep import OTHER_CONFIG_KEYS, RUNNER_KEYS
    from distributed_runner.launch.launcher import RAY_DEFAULTS
    from distributed_runner.model.sharding import FSDP_DEFAULTS

    page = gen.config_page()
    keys = [*RUNNER_KEYS, *OTHER_CONFIG_KEYS, *MMCV1_KEYS,
            *(key for key, _ in gen.nested_checked_keys()),
            *(f"launcher.{k}" for k in RAY_DEFAULTS if k != "type"),
            *(f"strategy.{k}" for k in FSDP_DEFAULTS)]
    for key in keys:
        assert f"| `{key}` |" in page, key
    nested = dict(gen.nested_checked_keys())
    assert {"train_cfg.max_epochs", "optim_wrapper.clip_grad.max_norm",
            "train_dataloader.batch_size", "randomness.seed"} <= set(nested)
    # the ranges are the checks' own words
    assert "| `1` | takes an int >= 1 |" in row(page, "train_cfg.val_interval")
    assert row(page, "optim_wrapper.clip_grad.max_norm").endswith(
        "| — | takes a finite number > 0 |")


def row(page: str, key: str) -> str:
    (line,) = [x for x in page.splitlines() if x.startswith(f"| `{key}` |")]
    return line


def table_cells(line: str) -> list[str]:
    """A Markdown table row's cells as Python-Markdown splits it: at pipes that are neither
    escaped nor inside a code span."""
    cells, cell, in_code, previous = [], "", False, ""
    for char in line:
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code and previous != "\\":
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
        previous = char
    return cells[1:]


def test_every_key_of_the_config_page_has_a_type_and_a_meaning_from_the_code(gen):
    """Type and meaning of each top-level and nested key come from the docstrings ('Args:') of
    the code that reads it, torch's for torch's arguments: none is missing."""
    page = gen.config_page()
    body = page.split("## Keys that are refused")[0]
    rows = [x for x in body.splitlines() if x.startswith("| `")]
    assert len(rows) >= 90
    empty = []
    for line in rows:
        cells = table_cells(line)
        if not cells[1].startswith("`") or len(cells[2]) < 8 or "Any" in cells[1]:
            empty.append(cells[0])
    assert empty == []
    assert row(page, "train_dataloader.num_workers").startswith(
        "| `train_dataloader.num_workers` | `int` | how many subprocesses to use")
    assert "| `launcher` | `str | dict` | 'none' (this process) or Ray" in page


def test_args_sections_are_read_as_torch_and_this_project_write_them(gen):
    def documented(a, b=1):
        """Summary.

        Args:
            a (int, optional): first sentence here. Second sentence
                not included.
            b: no type. (default: ``1``)
        Returns:
            nothing
        """

    assert gen.arg_docs(documented) == {"a": ("int", "first sentence here"),
                                        "b": ("", "no type")}


def test_the_cli_page_has_every_option(gen):
    from distributed_runner.cli import build_parser

    page = gen.cli_page()
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in commands.choices.items():
        section = page.split(f"\n## `drun {name}`\n")[1].split("\n## ")[0]
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in section, (name, flag)


def test_every_insert_of_the_pages_renders(gen):
    for page in (ROOT / "docs").rglob("*.md"):
        text = page.read_text()
        expanded = gen.expand_inserts(text)
        assert "<!-- insert:" not in expanded, page
        for directive in re.findall(r"^<!-- insert: .* -->$", text, re.M):
            assert len(gen.expand_inserts(directive).strip()) > 100, (page, directive)


def test_the_loop_page_shows_the_loops_docstring(gen):
    import distributed_runner.engine.loops
    from distributed_runner.checkpoint.parts import PARTS
    from distributed_runner.engine.hook import MOUNT_POINTS

    loop = gen.expand_inserts((ROOT / "docs" / "explanation" / "loop.md").read_text())
    for line in distributed_runner.engine.loops.__doc__.splitlines():
        if line.startswith("    ") and line.strip():
            assert line[4:].rstrip() in loop, line
    for mount in MOUNT_POINTS:
        assert f"| `{mount}`" in loop, mount
    parts = gen.expand_inserts((ROOT / "docs" / "explanation" / "checkpoints.md").read_text())
    for part in PARTS:
        assert f"| `{part.key}` |" in parts, part.key


def test_rst_roles_and_literal_blocks_become_markdown(gen):
    text = gen.rst_to_markdown("See :func:`~a.b.run` and :class:`x.Y`::\n\n    code here\n\nEnd.")
    assert text == "See `run` and `x.Y`:\n\n```text\ncode here\n```\n\nEnd."


def test_the_drun_synopsis_names_only_real_options():
    from distributed_runner.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    lines = docs_block("drun-synopsis").replace("\n  ", " ").splitlines()
    seen = set()
    for line in lines:
        name = line.split()[1]
        flags = set(re.findall(r"--[\w-]+", line.split("#")[0]))
        known = {f for a in commands.choices[name]._actions for f in a.option_strings}
        assert flags <= known, (name, flags - known)
        seen.add(name)
    assert seen == set(commands.choices)


def test_ci_runs_the_test_command_the_readme_gives():
    readme_command = docs_block("test-command").strip()
    run = (ROOT / ".ci" / "run").read_text().splitlines()
    ci_command = next(line for line in run if "pytest" in line and not line.startswith("#"))
    ci_command = ci_command.removesuffix(" || status=1")  # .ci/run reports every check's failure
    assert shlex.split(ci_command.replace("install -q ", "install ")) == \
        shlex.split(readme_command)
