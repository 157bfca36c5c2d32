"""The package's shape (issue 35): what sits at the top of ``distributed_runner``, the rules
import-linter cannot state, and the 0.1 module names that keep working.

The layers themselves are import-linter's contracts in ``pyproject.toml`` (``lint-imports`` in
``.ci/lint``); these tests hold what a layers contract does not: no function over the project's
60-line rule, Ray's private modules in one adapter, a docstring on each subpackage saying what it
owns and may import, and every old module name answering with its new module.
"""
from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

import distributed_runner
from distributed_runner.core.moved import MOVED

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "distributed_runner"
TOP_LEVEL_FILES = {"__init__.py", "cli.py", "version.py", "py.typed"}
MAX_FUNCTION_LINES = 60
RAY_ADAPTER = PACKAGE / "core" / "ray_private.py"


def _subpackages() -> list[str]:
    return sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


def _sources() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.py"), *(ROOT / "hooks").rglob("*.py")])


def test_the_top_of_the_package_holds_only_subpackages_the_cli_and_the_version():
    loose = sorted(
        p.name for p in PACKAGE.iterdir()
        if p.is_file() and p.name not in TOP_LEVEL_FILES
    )
    assert loose == [], f"modules at the top of distributed_runner/: {loose}; give them a subpackage"
    others = [p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"
              and not (p / "__init__.py").is_file()]
    assert others == [], f"folders without __init__.py: {others}"


def test_the_layers_contract_names_every_subpackage():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c.get("containers") == ["distributed_runner"])
    named = sorted(name.strip() for layer in layers["layers"] for name in layer.split("|"))
    assert named == sorted([*_subpackages(), "cli", "version"])
    assert layers.get("exhaustive") is True  # a new subpackage must be placed


def test_every_subpackage_says_what_it_owns_and_may_import():
    """At any depth (``checkpoint/hf``, ``tracking/sinks`` ...). ``core`` says it in its own
    words (nothing of the project but the version); ``examples`` is excused."""
    inits = sorted(p for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)
    assert len(inits) > len(_subpackages())  # the nested packages are looked at too
    for init in inits:
        name = init.parent.relative_to(PACKAGE).as_posix()
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"distributed_runner/{name}/__init__.py has no docstring"
        if name not in ("core", "examples"):
            assert "May import" in doc, f"distributed_runner/{name}: say what it may import"


def test_no_function_is_over_the_line_limit():
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines})")
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _private_ray_import(name: str) -> bool:
    parts = name.split(".")
    return parts[0] == "ray" and any(p.startswith("_") for p in parts[1:])


def test_only_the_adapter_imports_private_ray_modules():
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            if any(_private_ray_import(n) for n in names) and path != RAY_ADAPTER:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], f"private Ray imports outside core/ray_private.py: {offenders}"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_name_is_its_new_module(old):
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is new
    said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert said and MOVED[old] in said[0], said


def test_old_names_in_configs_and_pickles_resolve_in_a_fresh_process():
    """What a 0.1 config (``type=`` by import path) and a 0.1 checkpoint (pickled by module name)
    name, in a process that imported nothing before."""
    code = (
        "import pickle, warnings; warnings.simplefilter('ignore')\n"
        "from distributed_runner.core.external import import_path\n"
        "cls = import_path('distributed_runner.tta.TTAModel', 'model.type')\n"
        "from distributed_runner.model.tta import TTAModel; assert cls is TTAModel, cls\n"
        "from distributed_runner.engine.train_state import TrainState\n"
        "blob = pickle.dumps(TrainState, protocol=0).replace(b'distributed_runner.engine.train_state',"
        " b'distributed_runner.train_state')\n"
        "assert pickle.loads(blob) is TrainState\n"
        "from distributed_runner.optim import OptimWrapper, build_optim_wrapper\n"
        "from distributed_runner.checkpoint import load_file, atomic_save\n"
        "from distributed_runner.data import DefaultSampler\n"
        "from distributed_runner.model import BaseModel\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_name_that_never_existed_still_fails_as_usual():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("distributed_runner.no_such_module")
    assert distributed_runner.__version__


def test_the_version_has_one_value():
    from distributed_runner.version import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__ == distributed_runner.__version__


def test_the_package_init_imports_only_the_version_and_the_moved_names_eagerly():
    """Python runs ``distributed_runner/__init__.py`` before any submodule: whatever it imported
    at module level every leaf would import too (and ``hooks`` would import itself back)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    eager = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("distributed_runner"):
            eager |= {f"{node.module}.{a.name}" for a in node.names}
    assert eager == {"distributed_runner.core.moved", "distributed_runner.version.__version__"}
