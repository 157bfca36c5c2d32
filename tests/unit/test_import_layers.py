"""The import layers of ``distributed_runner`` and ``hooks``, read from the source with ``ast``.

What counts as an import: every ``import``/``from ... import`` statement anywhere in a module —
at module level, inside functions (a lazy import is still a dependency) and under
``if TYPE_CHECKING:`` (a type checker follows it, and a cycle there is a cycle in the design).
``from P import x`` is an import of module ``P.x`` when that module exists (``from . import dist``
imports ``distributed_runner.dist`` only), else of ``P`` itself (``from . import __version__``
imports the package ``__init__``). Python running a package's ``__init__`` before its submodules
is not counted as an edge; rule 5 is what makes that harmless for ``distributed_runner``.

The floors, top down: the package ``__init__`` (``distributed_runner``: what users import,
``from distributed_runner import Runner``), the entry points (:data:`ENTRY_POINTS`: ``cli``,
``launcher``, ``ray_worker``), the Runner (``distributed_runner.runner``), then everything else
(loops, dispatch, hooks, ..., down to ``runner_api``, ``version``, ``errors``). The rules:

1. No import cycles among the modules.
2. No module imports the package ``__init__``'s own names: nothing has an edge to
   ``distributed_runner`` itself (``__version__`` comes from ``distributed_runner.version``).
3. Only the top floor imports the Runner: edges to ``distributed_runner.runner`` come only from
   the package ``__init__`` and the entry points.
4. Only the top floor imports an entry point (``cli`` -> ``launcher`` -> ``ray_worker``).
5. The package ``__init__`` imports, at module level, only ``distributed_runner.version``: Python
   runs it before any submodule, so whatever it imported eagerly every leaf would import too
   (and ``hooks``, which the Runner's hook builder imports, would import itself back).
6. The bottom floor (:data:`BOTTOM`: ``version``, ``runner_api``) imports no project module, so
   any module may import it.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("distributed_runner", "hooks")
TOP = "distributed_runner"
ENTRY_POINTS = {
    f"{TOP}.cli",
    f"{TOP}.launcher",
    f"{TOP}.ray_worker",
    # drun tune: the driver builds trials, a trial builds its Runner (in-process) or uses the
    # launcher (Ray Train trials)
    f"{TOP}.tune.driver",
    f"{TOP}.tune.trainable",
    f"{TOP}.tune.in_process",
    f"{TOP}.tune.ray_trial",
    # async validation: the validation process / Ray validation task builds a Runner
    f"{TOP}.async_val_worker",
}
TOP_FLOOR = {TOP} | ENTRY_POINTS
BOTTOM = (f"{TOP}.version", f"{TOP}.runner_api")


def project_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the two packages (``__init__`` as the
    package's own name)."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module ``from <here> import`` names, made absolute."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: dict[str, Path], top_level_only: bool = False
               ) -> set[str]:
    """The project modules ``module`` imports (see the module docstring for what counts)."""
    tree = ast.parse(path.read_text(), str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
    return {name for name in found if name in modules and name != module}


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_graph_sees_relative_lazy_and_type_checking_imports():
    graph = import_graph()
    assert f"{TOP}.dist" in graph[f"{TOP}.control"]  # from . import dist
    assert f"{TOP}.runner" in graph[f"{TOP}.cli"]  # inside a function
    assert f"{TOP}.runner_api" in graph["hooks.hook"]  # under TYPE_CHECKING
    assert f"{TOP}.version" in graph[TOP]


def floor(module: str) -> int:
    """A module's floor, counted from the top: 0 the package ``__init__``, 1 the entry points,
    2 the Runner, 3 everything else."""
    if module == TOP:
        return 0
    if module in ENTRY_POINTS:
        return 1
    return 2 if module == f"{TOP}.runner" else 3


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for every import of a module on a higher floor (rules 2-4); an
    entry point importing another (``cli`` -> ``launcher`` -> ``ray_worker``) is not upward."""
    return sorted((m, dep) for m, deps in graph.items() for dep in deps
                  if floor(dep) < floor(m) and not (floor(dep) == floor(m) == 1))


def test_no_import_cycles_and_no_upward_imports():
    graph = import_graph()
    assert cycles(graph) == []
    assert upward_imports(graph) == []


def test_the_checks_find_a_planted_cycle_and_planted_upward_imports():
    """The checks can fail: in a small graph shaped like the tree before issue 29
    (``dispatch`` <-> ``hook_order``, ``checkpoint_state`` importing the package ``__init__``)
    plus a loop importing the Runner, each bad edge is found and the allowed ones are not."""
    d = {name: f"{TOP}.{name}" for name in (
        "version", "dispatch", "hook_order", "checkpoint_state", "loops", "runner", "cli",
        "launcher", "ray_worker")}
    graph = {
        TOP: {d["version"], d["runner"]}, d["version"]: set(),
        d["dispatch"]: {d["hook_order"]}, d["hook_order"]: {d["dispatch"]},
        d["checkpoint_state"]: {TOP}, d["loops"]: {d["runner"], d["dispatch"]},
        d["runner"]: {d["loops"]}, d["cli"]: {d["launcher"], d["runner"]},
        d["launcher"]: {d["ray_worker"]}, d["ray_worker"]: {d["runner"]},
    }
    assert cycles(graph) == [[d["dispatch"], d["hook_order"]], [d["loops"], d["runner"]]]
    assert upward_imports(graph) == [(d["checkpoint_state"], TOP), (d["loops"], d["runner"])]


def test_the_package_init_imports_only_the_version_eagerly():
    modules = project_modules()
    assert imports_of(TOP, modules[TOP], modules, top_level_only=True) == {f"{TOP}.version"}


def test_the_bottom_floor_imports_nothing_from_the_project():
    graph = import_graph()
    assert {m: sorted(graph[m]) for m in BOTTOM} == {m: [] for m in BOTTOM}


def test_the_version_has_one_value():
    import distributed_runner
    from distributed_runner.version import __version__

    project = (ROOT / "pyproject.toml").read_text().split("[project]", 1)[1]
    stated = re.search(r'^version\s*=\s*"([^"]+)"', project, re.M)
    assert distributed_runner.__version__ == __version__
    assert stated is None or stated.group(1) == __version__
