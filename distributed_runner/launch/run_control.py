"""The driver's Ctrl-C carried to the workers of a Ray run, through the cluster's key-value store
(the GCS's, which every process of the cluster reaches; ``core/ray_private.kv_*``).

Ray Train runs the training function off the workers' main threads, where Python takes no signal,
and the driver's SIGINT would otherwise only tear the group down. So the driver turns the first
Ctrl-C into a stop request under the run's key (:meth:`RunControl.stop`); rank 0's
``RayPauseHook`` reads that key on a thread of its own, twice a second (the training thread makes
no Ray call for it), and at the next iteration requests the pause — every rank agrees on it at the
end of an iteration, writes (and reports) its checkpoint and returns; rank 0 records where it
stopped (:meth:`RunControl.paused`) and the driver prints the same one line as a run without Ray
(exit 130). A second Ctrl-C leaves at once.

The keys are the run's own (its name, the driver's pid and start time: two drivers never share
them) and the driver deletes them when the run ends. A named actor per run held them before: a
process of its own, which imports Ray, at every run's start.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from distributed_runner.core.preemption import INTERRUPT


class RunControl:
    """One run's stop request (the driver's) and where its workers paused or what they tested
    (rank 0's), as keys of the cluster's store. Every call needs this process connected to the
    run's Ray cluster; Ray Train is imported only then (``core.ray_private``)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def stop(self, reason: str) -> None:
        from distributed_runner.core.ray_private import kv_put

        kv_put(f"{self.name}/stop", reason)

    def stop_reason(self) -> str | None:
        from distributed_runner.core.ray_private import kv_get

        return kv_get(f"{self.name}/stop")

    def paused(self, iteration: int | None, checkpoint: str) -> None:
        from distributed_runner.core.ray_private import kv_put

        kv_put(f"{self.name}/paused", json.dumps([iteration, checkpoint]))

    def paused_at(self) -> tuple[int | None, str] | None:
        from distributed_runner.core.ray_private import kv_get

        value = kv_get(f"{self.name}/paused")
        if value is None:
            return None
        iteration, checkpoint = json.loads(value)  # as paused() wrote them: int or None, str
        return iteration, checkpoint

    def tested(self, metrics: dict) -> None:
        """Rank 0's ``drun test`` metrics, for the driver to print (Ray Train's result keeps
        only what was reported with a checkpoint)."""
        from distributed_runner.core.ray_private import kv_put

        kv_put(f"{self.name}/tested", json.dumps(metrics, default=float))

    def test_metrics(self) -> dict | None:
        from distributed_runner.core.ray_private import kv_get

        value = kv_get(f"{self.name}/tested")
        return None if value is None else dict(json.loads(value))

    def clear(self) -> None:
        from distributed_runner.core.ray_private import kv_delete

        for key in ("stop", "paused", "tested"):
            kv_delete(f"{self.name}/{key}")


@contextlib.contextmanager
def ctrl_c_pauses(control: RunControl, active: bool = True) -> Iterator[None]:
    """On the driver's main thread, while the workers train: the first Ctrl-C asks them to stop
    after their iteration, the second raises ``KeyboardInterrupt`` (Ray then tears down).
    Inactive (Ray's own handler in charge) when ``active`` is False."""
    if not active or threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[bool] = []

    def handler(signum: int, frame: Any) -> None:
        if pressed:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        pressed.append(True)
        print(
            "drun: Ctrl-C: the workers finish this iteration, save a checkpoint and stop "
            "(Ctrl-C again to quit at once)",
            file=sys.stderr,
            flush=True,
        )
        control.stop(INTERRUPT)

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
