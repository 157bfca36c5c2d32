"""The driver's Ctrl-C carried to the workers of a Ray run: a tiny asyncio actor (0 CPUs) that the
launcher creates for each run and the workers find by name.

Ray Train runs the training function off the workers' main threads, where Python takes no signal,
and the driver's SIGINT would otherwise only tear the group down. So the driver turns the first
Ctrl-C into :meth:`RunControl.stop`; rank 0's ``RayPauseHook`` waits on one :meth:`wait_stop`
call in a thread of its own (the training thread makes no Ray call for it) and at the next
iteration requests the pause — every rank agrees on it at the end of an iteration, writes (and
reports) its checkpoint and returns; rank 0 records where it stopped (:meth:`paused`) and the
driver prints the same one line as a run without Ray (exit 130). A second Ctrl-C leaves at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from distributed_runner.core.preemption import INTERRUPT


class RunControl:
    """The stop request from the driver, and where the workers stopped (see the module
    docstring)."""

    def __init__(self) -> None:
        self._stopped = asyncio.Event()
        self._reason: str | None = None
        self._paused: tuple[int, str] | None = None

    def stop(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason
            self._stopped.set()

    async def wait_stop(self) -> str | None:
        await self._stopped.wait()
        return self._reason

    def paused(self, iteration: int, checkpoint: str) -> None:
        self._paused = (iteration, checkpoint)

    def paused_at(self) -> tuple[int, str] | None:
        return self._paused


def start_control(name: str) -> Any:
    """The run's control actor, named ``name``: 0 CPUs (it must never wait for a slot), on the
    driver's node (as Ray Train's controller), so that losing a worker's node never loses it."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    actor = ray.remote(num_cpus=0)(RunControl)
    return actor.options(name=name, scheduling_strategy=here).remote()


@contextlib.contextmanager
def ctrl_c_pauses(control: Any, active: bool = True) -> Iterator[None]:
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
        control.stop.remote(INTERRUPT)

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
