"""RayPauseHook: the driver's Ctrl-C, acted on by the workers of a Ray run."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class RayPauseHook(Hook):
    """Rank 0 watches the run's control actor (distributed_runner/launch/run_control.py) and,
    when the driver was interrupted, requests the pause: every rank ends the iteration, saves
    and reports a checkpoint and returns. The watch is one outstanding actor call looked at with
    ``ray.wait(timeout=0)`` at most every ``poll_s`` seconds: nothing on the other iterations.

    Added by ``--launcher ray`` to every worker's hooks, with the control actor's name; without
    one (``control=None``) it does nothing. Not meant for a config.
    """

    priority = "LOWEST"

    def __init__(self, control: str | None = None, poll_s: float = 0.5) -> None:
        self.control, self.poll_s = control, float(poll_s)
        self._pending: Any = None
        self._next = 0.0

    def before_train(self, runner: RunnerAPI) -> None:
        if self.control is None or runner.rank != 0:
            return
        import ray

        self._pending = ray.get_actor(self.control).wait_stop.remote()

    def after_train_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        if self._pending is None or time.monotonic() < self._next:
            return
        import ray

        self._next = time.monotonic() + self.poll_s
        ready, _ = ray.wait([self._pending], timeout=0)
        if ready:
            self._pending = None
            runner.request_pause(ray.get(ready[0]))
