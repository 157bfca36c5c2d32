"""The docs' reference pages and inserted docstrings, generated from the code at every build.

MkDocs loads this file as a hook (``hooks:`` in ``mkdocs.yml``): ``on_files`` adds the generated
pages (:data:`PAGES`: config keys, hooks, CLI) to the site, ``on_page_markdown`` replaces every
``<!-- insert: NAME ARGS -->`` line of a hand-written page with generated text (``gen_inserts.py``
beside this file: a module docstring, the mount points, the checkpoint parts, the module tables,
the import contracts, the files of one iteration), and ``on_page_content`` turns the Sphinx roles
of docstrings (``:class:`~a.B```) into plain code.
Nothing here is written by hand about the code: each table is read from the structure the code
itself uses — the checks a config passes before anything is built, the ``HOOKS`` registry, the
argparse parser — so the reference cannot drift. ``python docs/gen_reference.py OUT_DIR``
writes the pages to look at.

``tests/unit/test_docs_reference.py`` checks that the pages name every registered hook, every
config key and every CLI option.
"""
from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, Path(__file__).parent):  # the checkout's package; gen_inserts beside this
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gen_inserts import _ROLES, INSERTS, expand_inserts, rst_to_markdown  # noqa: E402,F401

GENERATED_NOTE = ("*Generated from the code by `docs/gen_reference.py` at every docs build; "
                  "edit the code, not this page.*\n")


class _Probe:
    """A value no check accepts: what a check says about it is what the key takes."""

    def __repr__(self) -> str:
        return "<probe>"


PROBE = _Probe()
PROBE_BASE = {"work_dir": "work_dirs/probe", "model": {"type": "Linear", "in_features": 1,
                                                       "out_features": 1}}
# what a section needs around a probed key for the key to be read at all
PROBE_CONTEXT = {"strategy": {"type": "fsdp"}, "launcher": {"type": "ray"}}
_GOT = re.compile(r",? ?got (?:<probe>|_Probe);? ?")


def _cell(text: Any) -> str:
    """A table cell: ``|`` escaped outside code spans only (Python-Markdown's tables keep a code
    span's pipes, and show an escaped one inside a code span with its backslash)."""
    parts = str(text).replace("\n", " ").split("`")
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def _code(value: Any) -> str:
    return _cell(f"`{value!r}`")


def _type(kind: str) -> str:
    """A type as code (its pipes stay: a code span keeps the table's columns)."""
    return _cell(f"`{kind}`") if kind else ""


# -- meanings, from docstrings ------------------------------------------------------------------
_ARG = re.compile(r"^(\w+)(?: \(([^)]*)\))?:\s*(.*)$")


def arg_docs(obj: Any) -> dict[str, tuple[str, str]]:
    """``name -> (type, meaning)`` from the ``Args:`` section of ``obj``'s docstring (Google
    style, as torch's and ours are written): the meaning is the entry's first sentence."""
    entries: dict[str, list[str]] = {}
    lines = (inspect.getdoc(obj) or "").splitlines()
    indent, current = None, None
    for line in lines[next((i + 1 for i, x in enumerate(lines) if x.strip() == "Args:"),
                           len(lines)):]:
        if not line.strip():
            continue
        lead = len(line) - len(line.lstrip())
        match = _ARG.match(line.strip())
        if match and (indent is None or lead == indent):
            indent, current = lead, match.group(1)
            entries[current] = [match.group(2) or "", match.group(3)]
        elif indent is not None and lead > indent and current:
            entries[current][1] += " " + line.strip()
        else:
            break
    return {name: (re.sub(r", (optional|keyword-only arg)", "", kind).strip(), _first_sentence(text))
            for name, (kind, text) in entries.items()}


def _first_sentence(text: str) -> str:
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text).replace("``", "`")
    text = re.split(r"(?<=[.)])\s+(?=[A-Z(])", text.strip(), maxsplit=1)[0]
    return re.sub(r"\s*\(default: [^)]*\)\.?$", "", text).rstrip(".")


def nested_docs() -> dict[str, dict[str, tuple[str, str]]]:
    """Section -> its keys' (type, meaning), from the docstrings of the code that reads them
    (torch's for what is torch's: the DataLoader, the optimizer, gradient clipping)."""
    import torch

    from distributed_runner.core.randomness import set_random_seed
    from distributed_runner.engine.config_check import check_train_cfg
    from distributed_runner.fault_tolerance.options import parse_fault_tolerance
    from distributed_runner.health.watchdog import parse_watchdog, phase_timeouts
    from distributed_runner.launch.launcher_config import normalize_launcher
    from distributed_runner.model.sharding import _parse_fsdp
    from distributed_runner.optim.wrapper import OptimWrapper
    from distributed_runner.validation.async_validation import ValMode

    loader = arg_docs(torch.utils.data.DataLoader)
    return {"randomness": arg_docs(set_random_seed), "train_cfg": arg_docs(check_train_cfg),
            "train_dataloader": loader, "val_dataloader": loader, "test_dataloader": loader,
            "optim_wrapper": arg_docs(OptimWrapper.__init__),
            "optim_wrapper.optimizer": arg_docs(torch.optim.SGD),
            "optim_wrapper.clip_grad": arg_docs(torch.nn.utils.clip_grad_norm_),
            "launcher": arg_docs(normalize_launcher), "strategy": arg_docs(_parse_fsdp),
            "watchdog": arg_docs(parse_watchdog),
            "watchdog.phase_timeouts": arg_docs(phase_timeouts),
            "val_cfg": arg_docs(ValMode), "fault_tolerance": arg_docs(parse_fault_tolerance)}


# -- config keys --------------------------------------------------------------------------------
def config_checks(cfg: dict) -> None:
    """Every check a config passes before anything is built, in the order a run meets them:
    the Runner's preparation (``Runner.from_cfg``; the Ray driver's too), the driver's own
    checks, then the launcher's and the preemption options' parsers."""
    from distributed_runner.core.preemption import parse_preemption
    from distributed_runner.engine.config_prep import prepare_config
    from distributed_runner.health.watchdog import parse_watchdog
    from distributed_runner.launch.launcher import normalize_launcher, validate_config

    prepare_config(dict(cfg))
    validate_config(dict(cfg))
    normalize_launcher(cfg.get("launcher", "none"))
    parse_preemption(cfg.get("preemption", True))
    parse_watchdog(cfg.get("watchdog"))


def probe(path: str) -> str:
    """What the checks say when ``path`` (dotted) holds a value nobody accepts: ``takes ...``,
    or ``''`` when nothing checks it before building."""
    from distributed_runner.core.errors import ConfigError

    cfg = {k: dict(v) if isinstance(v, dict) else v for k, v in PROBE_BASE.items()}
    *parents, leaf = path.split(".")
    if parents:
        cfg.update({k: dict(v) for k, v in PROBE_CONTEXT.items() if k == parents[0]})
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = PROBE
    try:
        config_checks(cfg)
    except ConfigError as e:
        return _GOT.sub(" ", e.message).strip()
    except Exception as e:  # a check that fails on odd input instead of naming the key
        return f"(not checked for its type: {type(e).__name__})"
    return ""


def nested_checked_keys() -> list[tuple[str, str]]:
    """(dotted key, kind) for every nested key ``config_check`` checks, recorded by running it
    on a config that has every section it looks into."""
    from distributed_runner.engine import config_check as cc
    from distributed_runner.engine.config_prep import OTHER_CONFIG_KEYS, RUNNER_KEYS

    found: list[tuple[str, str]] = []
    originals = {name: getattr(cc, name) for name in ("positive_int", "boolean", "number")}

    def recorder(kind: str) -> Callable[..., None]:
        def record(cfg: dict, name: str, key: str, *args: Any, **kwargs: Any) -> None:
            found.append((f"{key}.{name}", kind))
            originals[kind](cfg, name, key, *args, **kwargs)
        return record

    skeleton = {"train_cfg": {}, "optim_wrapper": {"optimizer": {}, "clip_grad": {}},
                "randomness": {"seed": 0}, "train_dataloader": {}, "val_dataloader": {},
                "test_dataloader": {}}
    try:
        for kind in originals:
            setattr(cc, kind, recorder(kind))
        cc.check_config(skeleton, RUNNER_KEYS, OTHER_CONFIG_KEYS)
    finally:
        for kind, fn in originals.items():
            setattr(cc, kind, fn)
    return list(dict.fromkeys(found))


def _defaults(fn: Callable) -> dict[str, Any]:
    return {p.name: p.default for p in inspect.signature(fn).parameters.values()
            if p.default is not p.empty}


def default_sources() -> dict[str, dict[str, Any]]:
    """Section -> its keys' defaults, from the signatures and tables the code uses."""
    from distributed_runner.engine.loops import EpochBasedTrainLoop, IterBasedTrainLoop
    from distributed_runner.fault_tolerance.options import DEFAULTS as FT_DEFAULTS
    from distributed_runner.health.watchdog import PHASE_TIMEOUT_DEFAULTS, WATCHDOG_DEFAULTS
    from distributed_runner.launch.launcher import RAY_DEFAULTS
    from distributed_runner.model.sharding import FSDP_DEFAULTS
    from distributed_runner.optim.wrapper import OptimWrapper
    from distributed_runner.validation.async_validation import ValMode

    loop = {**_defaults(IterBasedTrainLoop.__init__), **_defaults(EpochBasedTrainLoop.__init__)}
    return {"train_cfg": loop, "optim_wrapper": _defaults(OptimWrapper.__init__),
            "launcher": dict(RAY_DEFAULTS), "strategy": dict(FSDP_DEFAULTS),
            "watchdog": {k: v for k, v in WATCHDOG_DEFAULTS.items() if k != "phase_timeouts"},
            "watchdog.phase_timeouts": dict(PHASE_TIMEOUT_DEFAULTS),
            "val_cfg": vars(ValMode()), "fault_tolerance": dict(FT_DEFAULTS)}


def config_page() -> str:
    from distributed_runner.engine.config_check import MMCV1_KEYS, NEAR_MISS
    from distributed_runner.engine.config_prep import (
        OTHER_CONFIG_DOCS,
        OTHER_CONFIG_KEYS,
        REQUIRED_KEYS,
        RUNNER_KEYS,
    )
    from distributed_runner.engine.runner import Runner
    from distributed_runner.fault_tolerance.options import DEFAULTS as FT_DEFAULTS
    from distributed_runner.health.watchdog import PHASE_TIMEOUT_DEFAULTS, WATCHDOG_DEFAULTS
    from distributed_runner.launch.launcher import RAY_DEFAULTS
    from distributed_runner.model.sharding import FSDP_DEFAULTS
    from distributed_runner.validation.async_validation import KEYS as VAL_MODE_KEYS

    params = inspect.signature(Runner.__init__).parameters
    out = ["# Config keys", "", GENERATED_NOTE,
           "Every top-level key a config may set, with the checks it passes before anything is "
           "built (in `Runner.from_cfg` and, for `--launcher ray`, on the driver before any "
           "worker starts). *Checked* is what the check's own error message says the key takes; "
           "an empty cell means the value is checked when it is built (its registry matches "
           "`type` and the arguments against the constructor). What each key means: "
           "[Write a config](../how-to/configs.md).", "",
           "## Top-level keys", "",
           "| Key | Type | Meaning | Required | Default | Checked |", "|---|---|---|---|---|---|"]
    meanings = {**arg_docs(Runner), **OTHER_CONFIG_DOCS}
    for key in (*RUNNER_KEYS, *OTHER_CONFIG_KEYS):
        param = params.get(key)
        default = "—" if param is None or param.default is param.empty else _code(param.default)
        kind, meaning = meanings.get(key, ("", ""))
        required = "yes: " + REQUIRED_KEYS[key] if key in REQUIRED_KEYS else "no"
        out.append(f"| `{key}` | {_type(kind)} | {_cell(meaning)} | {_cell(required)} | "
                   f"{default} | {_cell(probe(key)) or 'when built'} |")
    sections = default_sources()
    nested = [key for key, _ in nested_checked_keys()]
    nested += [f"launcher.{k}" for k in RAY_DEFAULTS if k != "type"]
    nested += [f"strategy.{k}" for k in FSDP_DEFAULTS]
    nested += [f"watchdog.{k}" for k in WATCHDOG_DEFAULTS]
    nested += [f"watchdog.phase_timeouts.{k}" for k in PHASE_TIMEOUT_DEFAULTS]
    nested += [f"val_cfg.{k}" for k in VAL_MODE_KEYS]
    nested += [f"fault_tolerance.{k}" for k in FT_DEFAULTS]
    out += ["", "## Nested keys", "",
            "The keys inside the sections that are checked before building, with their "
            "defaults where a signature or a defaults table of the code gives one "
            "(`launcher`: the Ray launcher's; `strategy`: FSDP's; `watchdog`: the hang watch's, "
            "[Hangs](../how-to/hangs.md); `val_cfg`: where validation runs, "
            "[Validate without stopping training](../how-to/async-validation.md)). "
            "Dataloader keys other than `dataset` and `batch_size` are "
            "`torch.utils.data.DataLoader`'s arguments, with its defaults.", "",
            "| Key | Type | Meaning | Default | Checked |", "|---|---|---|---|---|"]
    docs = nested_docs()
    for key in nested:
        section, _, leaf = key.rpartition(".")
        defaults = sections.get(section, {})
        default = _code(defaults[leaf]) if leaf in defaults else "—"
        kind, meaning = docs.get(section, {}).get(leaf, ("", ""))
        out.append(f"| `{key}` | {_type(kind)} | {_cell(meaning)} | {default} | "
                   f"{_cell(probe(key)) or 'when built'} |")
    out += ["", "## Keys that are refused", "",
            f"A top-level name that is a near-miss of a key above (similarity >= {NEAR_MISS}, "
            "e.g. `trian_cfg`) is an error that names the key meant; other unknown names are "
            "helper variables and fine. These MMCV 1.x keys are refused with what replaced "
            "them:", "", "| Key | Use instead |", "|---|---|"]
    out += [f"| `{key}` | `{_cell(instead)}` |" for key, instead in MMCV1_KEYS.items()]
    return "\n".join(out) + "\n"


# -- hooks --------------------------------------------------------------------------------------
def mounts_of(cls: type) -> list[str]:
    from distributed_runner.engine.hook import MOUNT_POINTS, overrides

    instance = cls.__new__(cls)
    return [m for m in MOUNT_POINTS if overrides(instance, m)]


def hook_parameters(cls: type) -> str:
    from distributed_runner.engine.hook import Hook

    if cls.__init__ is object.__init__ or cls.__init__ is Hook.__init__:
        return "—"
    parts = []
    for p in list(inspect.signature(cls.__init__).parameters.values())[1:]:
        if p.kind is p.VAR_KEYWORD:
            parts.append(f"`**{p.name}`")
        elif p.kind is p.VAR_POSITIONAL:
            parts.append(f"`*{p.name}`")
        else:
            parts.append(f"`{p.name}`" if p.default is p.empty else
                         f"`{p.name}={p.default!r}`".replace("|", "\\|"))
    return ", ".join(parts) or "—"


def hooks_page() -> str:
    from distributed_runner.core.registry import HOOKS
    from distributed_runner.engine.hook_builder import (
        DEFAULT_HOOKS,
        LAUNCHER_HOOKS,
        RESERVED_KEYS,
        default_name,
    )
    from distributed_runner.engine.priority import get_priority, priority_name
    from hooks import CheckpointSaver, Priority, RankFigures, SinkProvider, StepGuard

    defaults = {spec["type"]: (key, {k: v for k, v in spec.items() if k != "type"})
                for key, spec in DEFAULT_HOOKS.items()}
    added = {spec["type"]: launcher for launcher, specs in LAUNCHER_HOOKS.items()
             for spec in specs}
    out = ["# Hooks", "", GENERATED_NOTE,
           f"Every hook registered in `HOOKS` ({len(HOOKS.keys())}), read from the registry: "
           "its priority and error policy (class attributes), its parameters (its `__init__`), "
           "the mount points and extension points it implements. How to use them: "
           "[Built-in hooks](../how-to/builtin-hooks.md) and "
           "[Default hooks](../how-to/default-hooks.md).", "",
           "## Priorities", "", "Lower runs first; equal priorities keep registration order.",
           "", "| Priority | Value |", "|---|---|"]
    out += [f"| {p.name} | {int(p)} |" for p in Priority]
    out += ["", "Keys every hook's config also takes (handled by the dispatcher, not passed to "
            "the hook): " + ", ".join(f"`{k}`" for k in RESERVED_KEYS) + ".", "",
            "## Default hooks", "", "| Key | Hook | Config |", "|---|---|---|"]
    out += [f"| `{key}` | [{spec['type']}](#{spec['type'].lower()}) | `{_cell(spec)}` |"
            for key, spec in DEFAULT_HOOKS.items()]
    out += ["", "## Every registered hook", ""]
    points = {StepGuard: "step guard", CheckpointSaver: "checkpoint saver",
              SinkProvider: "log sinks", RankFigures: "rank figures"}
    for name in HOOKS.keys():
        cls = HOOKS.get(name)
        doc = inspect.getdoc(cls) or ""
        summary = doc.split("\n\n")[0].replace("\n", " ")
        rows = [("Registered name", f"`{name}`; in a config by default named "
                                    f"`{default_name(name)}`"),
                ("Priority", priority_name(get_priority(cls.priority))),
                ("`on_error`", f"`{cls.on_error}`"),
                ("Parameters", hook_parameters(cls)),
                ("Mount points", ", ".join(f"`{m}`" for m in mounts_of(cls)) or "—"),
                ("Extension points", ", ".join(v for k, v in points.items()
                                               if issubclass(cls, k)) or "—"),
                ("Keeps state", "yes (`state_dict`)" if hasattr(cls, "state_dict") else "no"),
                ("Module", f"`{cls.__module__}`")]
        if name in defaults:
            key, args = defaults[name]
            rows.append(("Default hook", f"`default_hooks.{key}`" +
                         (f" with `{_cell(args)}`" if args else "")))
        if name in added:
            rows.append(("Added by", f"the `{added[name]}` launcher, on every worker"))
        out += [f"### {name}", "", _cell(rst_to_markdown(summary)), "", "| | |", "|---|---|"]
        out += [f"| {k} | {v} |" for k, v in rows]
        out.append("")
    return "\n".join(out)


# -- CLI ----------------------------------------------------------------------------------------
def _option_row(action: argparse.Action) -> str:
    flags = ", ".join(f"`{f}`" for f in action.option_strings) or f"`{action.dest}`"
    if action.nargs in ("+", "*"):
        flags += " ..."
    default = "" if action.default in (None, argparse.SUPPRESS) else _code(action.default)
    choices = ", ".join(f"`{c}`" for c in action.choices) if action.choices else ""
    return f"| {flags} | {_cell(action.help or '')} | {choices} | {default} |"


def cli_page() -> str:
    from distributed_runner.cli import build_parser

    parser = build_parser()
    out = ["# `drun` command line", "", GENERATED_NOTE,
           "Read from the parser `drun` runs (`distributed_runner.cli.build_parser`). "
           "A mistake in a config or an option is one line, `drun: error: KEY: ...`, and exit "
           "status 2 (`--debug` shows its traceback); a checkpoint that cannot be written is "
           "status 1; a run stopped by SIGTERM after its checkpoint exits with 143.", "",
           "```text", parser.format_usage().strip(), "```", "",
           "| Option | Meaning | Choices | Default |", "|---|---|---|---|"]
    out += [_option_row(a) for a in parser._actions
            if a.option_strings and not isinstance(a, argparse._HelpAction)]
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help for c in commands._choices_actions}
    for name, sub in commands.choices.items():
        out += ["", f"## `drun {name}`", "", _cell(helps.get(name, "")), "", "```text",
                sub.format_usage().strip(), "```", "",
                "| Argument | Meaning | Choices | Default |", "|---|---|---|---|"]
        out += [_option_row(a) for a in sub._actions if not isinstance(a, argparse._HelpAction)]
    return "\n".join(out) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "reference/config.md": config_page, "reference/hooks.md": hooks_page,
    "reference/cli.md": cli_page}

# -- MkDocs events ------------------------------------------------------------------------------
def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, make in PAGES.items():
        files.append(File.generated(config, uri, content=make()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return expand_inserts(markdown)


_HTML_ROLE = re.compile(r":(?:" + "|".join(_ROLES) + r"):<code>(~?)([^<]*)</code>")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """mkdocstrings renders docstrings as Markdown: their Sphinx roles become plain code."""
    return _HTML_ROLE.sub(lambda m: "<code>" + (m.group(2).split(".")[-1] if m.group(1)
                                                else m.group(2)) + "</code>", html)


if __name__ == "__main__":
    for uri, make in PAGES.items():
        target = Path(sys.argv[1] if len(sys.argv) > 1 else "site-reference") / uri
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(make())
