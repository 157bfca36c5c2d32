"""RayPauseHook: the driver's Ctrl-C, acted on by the workers of a Ray run."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class RayPauseHook(Hook):
    """Rank 0 reads, on a thread of its own, whether the run's driver was interrupted (the run's
    stop key in Ray's store: distributed_runner/launch/run_control.py), every ``poll_s``; the next
    ``after_train_iter`` then requests the pause: every rank ends the iteration, saves and
    reports a checkpoint and returns. The loop pays one attribute read per iteration (no Ray
    call: a ``ray.wait`` on the training thread showed in StragglerHook's per-rank figures).

    Added by ``--launcher ray`` to every worker's hooks, with the run's control name; without
    one (``control=None``) it does nothing. A store that cannot be read (the head node gone) is
    one warning; training goes on. Not meant for a config.
    """

    priority = "LOWEST"

    def __init__(self, control: str | None = None, poll_s: float = 0.5) -> None:
        self.control, self.poll_s = control, float(poll_s)
        self._reason: str | None = None  # set by the watching thread
        self._done = threading.Event()

    def before_run(self, runner: RunnerAPI) -> None:
        if self.control is None or runner.rank != 0:
            return
        from distributed_runner.launch.run_control import RunControl

        watch = threading.Thread(
            target=self._watch,
            args=(RunControl(self.control), runner.logger),
            name="drun-ray-pause",
            daemon=True,
        )
        watch.start()

    def _watch(self, control: Any, logger: Any) -> None:
        while not self._done.wait(self.poll_s):
            try:
                reason = control.stop_reason()
            except Exception as e:  # noqa: BLE001 - the store's RPC errors are Ray's own types
                logger.warning("Ctrl-C cannot reach this run any more (%s)", type(e).__name__)
                return
            if reason is not None:
                self._reason = reason
                return

    def after_train_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        if self._reason is not None:
            reason, self._reason = self._reason, None
            runner.request_pause(reason)

    def after_run(self, runner: RunnerAPI) -> None:
        self._done.set()
