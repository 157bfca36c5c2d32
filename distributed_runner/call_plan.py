"""One generated function per mount point that calls its hooks in order: the untimed hot path of
:meth:`HookDispatcher.call <distributed_runner.dispatch.HookDispatcher.call>`.

A loop over ``(method, slot)`` pairs calling ``method(runner, **kwargs)`` costs, per hook, the
loop step and unpacking the keyword dict again — about as much as the default hooks' own work at
``before/after_train_iter``. The generated function takes the mount point's keyword arguments once
and calls each hook directly with them::

    def after_train_iter(runner, batch_idx=None, data_batch=None, outputs=None):
        at = 0
        try:
            h0(runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs)
            at = 1
            h1(runner, batch_idx=batch_idx, data_batch=data_batch, outputs=outputs)
        except Exception as exc:
            failed(at, exc, runner, {...})   # the hook's error policy, then the hooks after it

Hooks are called with every argument of the mount point's signature (MMEngine's), as its Runner
does; an argument the caller left out is None.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

from hooks.hook import Hook

Failed = Callable[[int, Exception, Any, dict], None]


def mount_arguments(mount: str) -> list[str]:
    """The keyword arguments of mount point ``mount`` after ``runner`` (``Hook``'s signature)."""
    return list(inspect.signature(getattr(Hook, mount)).parameters)[2:]


def _nothing(runner: Any, **kwargs: Any) -> None:
    """A mount point no hook implements."""


def compile_mount(mount: str, methods: tuple[Callable, ...], failed: Failed) -> Callable:
    """``fn(runner, **kwargs)`` calling ``methods`` in order; when the hook at position ``i``
    raises, ``failed(i, exc, runner, kwargs)`` applies its policy and calls the hooks after it."""
    if not methods:
        return _nothing
    names = mount_arguments(mount)
    params = ", ".join(["runner"] + [f"{n}=None" for n in names])
    passed = ", ".join(["runner"] + [f"{n}={n}" for n in names])
    as_dict = "{" + ", ".join(f"{n!r}: {n}" for n in names) + "}"
    lines = [f"def {mount}({params}):", "    at = 0", "    try:"]
    for i in range(len(methods)):
        if i:
            lines.append(f"        at = {i}")
        lines.append(f"        h{i}({passed})")
    lines += ["    except Exception as exc:", f"        failed(at, exc, runner, {as_dict})"]
    namespace: dict[str, Any] = {f"h{i}": m for i, m in enumerate(methods)}
    namespace["failed"] = failed
    exec(compile("\n".join(lines), f"<hook dispatch: {mount}>", "exec"), namespace)  # noqa: S102
    return namespace[mount]
