"""What hook dispatch costs per mount point call: 2 hooks implementing it, 50 registered of which
2 implement it, and the same 2 called without timing or error policy. Printed at the end of
``benchmarks/hook_overhead.py``; ``python benchmarks/dispatch_cost.py`` runs it alone."""
from __future__ import annotations

import statistics
import sys
import time
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed_runner.engine.dispatch import HookDispatcher
from hooks import Hook


class Implements(Hook):
    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        pass


class Other(Hook):
    def before_val(self, runner) -> None:
        pass


def dispatch_cost(total: int, implementing: int, calls: int = 200_000) -> float:
    """Nanoseconds per call of one mount point."""
    class Holder:
        pass

    holder = Holder()
    d = HookDispatcher(holder)
    for i in range(total - implementing):
        d.register(Other(), f"other{i}")
    for i in range(implementing):
        d.register(Implements(), f"impl{i}")
    call = d.call
    start = time.perf_counter()
    for _ in range(calls):
        call("after_train_iter", batch_idx=0, data_batch=None, outputs=None)
    return (time.perf_counter() - start) / calls * 1e9


def untimed_cost(implementing: int = 2, calls: int = 200_000) -> float:
    """``dispatch_cost`` for a dispatcher without timing or error policy: the same table walk,
    keyword passing and weak runner proxy, nothing else."""
    class Holder:
        pass

    holder = Holder()
    proxy = weakref.proxy(holder)
    table = {"after_train_iter": tuple(Implements().after_train_iter
                                       for _ in range(implementing))}

    def call(mount, **kwargs):
        for fn in table[mount]:
            fn(proxy, **kwargs)

    start = time.perf_counter()
    for _ in range(calls):
        call("after_train_iter", batch_idx=0, data_batch=None, outputs=None)
    return (time.perf_counter() - start) / calls * 1e9


def print_dispatch_costs(rounds: int = 7) -> None:
    two, fifty, untimed = [], [], []
    for _ in range(rounds):  # interleaved, medians: the machine is noisy
        two.append(dispatch_cost(2, 2))
        fifty.append(dispatch_cost(50, 2))
        untimed.append(untimed_cost(2))
    two, fifty, raw = (statistics.median(x) for x in (two, fifty, untimed))
    print(f"dispatch, 2 hooks implementing the mount point          : {two:6.0f} ns/call")
    print(f"dispatch, 50 hooks registered, 2 implementing the point : {fifty:6.0f} ns/call   "
          f"ratio {fifty / two:.2f}")
    print(f"same 2 hooks, dispatch without timing or error policy  : {raw:6.0f} ns/call   "
          f"timing + error policy: {(two - raw) / 2:.0f} ns per hook call")


if __name__ == "__main__":
    print_dispatch_costs()
