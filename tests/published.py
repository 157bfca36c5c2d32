"""Hooks as their authors published them, loaded from the published wheel for tests.

Nothing third-party is committed here: :func:`published_module` downloads the wheel once
(``pip download --no-deps`` into ``$DRUN_TEST_WHEELS``, default ``~/.cache/drun-test-wheels``),
reads one module's source out of it, replaces exactly the import lines it is given — each must
be present, so an upstream release that changes them fails loudly instead of testing something
else — and runs it as a module. Those replacements are the whole difference from the published
file, and each test lists them. A machine that cannot download the wheel skips the test and says
why.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from distributed_runner.core.registry import HOOKS, Registry

CACHE = Path(os.environ.get("DRUN_TEST_WHEELS", Path.home() / ".cache" / "drun-test-wheels"))
# what published hooks register into: their names (IterTimerHook ...) are ours too
SCRATCH_HOOKS = Registry("hook", "tests.published.SCRATCH_HOOKS")
# mmdet's own hook registry, made as mmdet/registry.py makes it: a child of ours, scope 'mmdet'
MMDET_HOOKS = Registry("hook", parent=HOOKS, scope="mmdet")


def wheel(package: str, version: str) -> Path:
    prefix = f"{package.replace('-', '_')}-{version}-".lower()  # the file may say iMIX-...

    def cached() -> list[Path]:
        return sorted(p for p in CACHE.glob("*.whl") if p.name.lower().startswith(prefix))

    found = cached()
    if not found:
        CACHE.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                               "-d", str(CACHE), f"{package}=={version}"],
                              capture_output=True, text=True, timeout=300)
        found = cached()
        if done.returncode or not found:
            pytest.skip(f"cannot download {package}=={version}: {done.stderr.strip()[-300:]}")
    return found[0]


def published_module(package: str, version: str, path: str,
                     rewrites: dict[str, str]) -> ModuleType:
    """Module ``path`` of ``package==version``'s wheel, with the import lines in ``rewrites``
    replaced (old line -> new line), executed under the name ``published.<package>.<module>``."""
    with zipfile.ZipFile(wheel(package, version)) as archive:
        source = archive.read(path).decode("utf-8")
    for old, new in rewrites.items():
        assert old in source, f"{package} {version} {path} no longer has {old!r}"
        source = source.replace(old, new)
    name = f"published.{package}.{Path(path).stem}"
    module = ModuleType(name)
    module.__file__ = f"{package}-{version}.whl/{path}"
    sys.modules[name] = module  # dataclasses and pickling look modules up by name
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def mmengine_hook(path: str, extra: dict[str, str] | None = None) -> ModuleType:
    """A hook module of mmengine 0.10.7 (``mmengine/hooks/<name>.py``): its ``Hook`` is ours,
    and it registers into :data:`SCRATCH_HOOKS`."""
    rewrites = {"from mmengine.registry import HOOKS":
                "from tests.published import SCRATCH_HOOKS as HOOKS",
                "from .hook import Hook": "from hooks import Hook"}
    rewrites.update(extra or {})
    return published_module("mmengine", "0.10.7", f"mmengine/hooks/{path}", rewrites)


def imix_hook(path: str) -> ModuleType:
    """A hook module of iMIX 0.1.0 (``imix/engine/hooks/<name>.py``), whose hooks are written
    iMIX's way (no runner argument; ``self.trainer``): its ``HookBase`` is our ``Hook`` and it
    registers into :data:`SCRATCH_HOOKS`."""
    return published_module("imix", "0.1.0", f"imix/engine/hooks/{path}", {
        "from .base_hook import HookBase": "from hooks import Hook as HookBase",
        "from .builder import HOOKS": "from tests.published import SCRATCH_HOOKS as HOOKS"})
