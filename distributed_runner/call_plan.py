"""One generated function per mount point that counts the call and calls its hooks in order: the
hot path of :class:`~distributed_runner.dispatch.HookDispatcher`.

A loop over ``(method, slot)`` pairs calling ``method(runner, **kwargs)`` costs, per hook, the
loop step and unpacking the keyword dict again — about as much as the default hooks' own work at
``before/after_train_iter``. The generated function takes the mount point's keyword arguments once
and calls each hook directly with them::

    def after_train_iter(batch_idx=None, data_batch=None, outputs=None):
        n = counts['after_train_iter'] = counts['after_train_iter'] + 1
        runner = runner_ref()
        if timed[n & mask]:                  # the sampled, timed path (dispatch.py)
            return call_timed(runner, table, {...})
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


def mount_arguments(mount: str) -> list[str]:
    """The keyword arguments of mount point ``mount`` after ``runner`` (``Hook``'s signature)."""
    return list(inspect.signature(getattr(Hook, mount)).parameters)[2:]


class Callers(dict):
    """Mount point -> caller, each generated at its first use after the tables last changed.

    The dispatcher clears it whenever its tables change (every registration, a disabled hook), so
    registering N hooks does not generate N x 23 functions; whoever holds this dict (the loops)
    always gets the current caller."""

    def __init__(self, make: Callable[[str], Callable[..., None]]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, mount: str) -> Callable[..., None]:
        caller = self[mount] = self._make(mount)
        return caller


def compile_caller(mount: str, table: tuple, env: dict[str, Any]) -> Callable[..., None]:
    """The caller of ``mount`` for ``table`` (``(method, slot)`` pairs in call order).

    ``env`` provides ``counts`` (mount point -> calls, updated here), ``runner_ref``, ``timed``
    and ``mask`` (which calls take the timed path), ``call_timed(runner, table, kwargs)`` and
    ``failed_at(table)`` -> ``failed(i, exc, runner, kwargs)`` (the policy of the hook at ``i``,
    then the hooks after it)."""
    names = mount_arguments(mount)
    params = ", ".join(f"{n}=None" for n in names)
    passed = ", ".join(["runner"] + [f"{n}={n}" for n in names])
    as_dict = "{" + ", ".join(f"{n!r}: {n}" for n in names) + "}"
    lines = [f"def {mount}({params}):",
             f"    n = counts[{mount!r}] = counts[{mount!r}] + 1"]
    if table:
        lines += ["    runner = runner_ref()",
                  "    if timed[n & mask]:",
                  f"        return call_timed(runner, table, {as_dict})",
                  "    at = 0", "    try:"]
        for i in range(len(table)):
            if i:
                lines.append(f"        at = {i}")
            lines.append(f"        h{i}({passed})")
        lines += ["    except Exception as exc:", f"        failed(at, exc, runner, {as_dict})"]
    namespace: dict[str, Any] = {f"h{i}": fn for i, (fn, _) in enumerate(table)}
    namespace.update(env, table=table, failed=env["failed_at"](table))
    exec(compile("\n".join(lines), f"<hook dispatch: {mount}>", "exec"), namespace)  # noqa: S102
    return namespace[mount]
