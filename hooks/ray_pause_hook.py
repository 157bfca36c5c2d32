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
    """Rank 0 waits, on a thread of its own, for the run's control actor
    (distributed_runner/launch/run_control.py) to say the driver was interrupted; the next
    ``after_train_iter`` then requests the pause: every rank ends the iteration, saves and
    reports a checkpoint and returns. The loop pays one attribute read per iteration (no Ray
    call: a ``ray.wait`` on the training thread showed in StragglerHook's per-rank figures).

    Added by ``--launcher ray`` to every worker's hooks, with the control actor's name; without
    one (``control=None``) it does nothing. A control actor that is gone (its driver died) is one
    warning; training goes on. Not meant for a config.
    """

    priority = "LOWEST"

    def __init__(self, control: str | None = None, poll_s: float = 10.0) -> None:
        self.control, self.poll_s = control, float(poll_s)
        self._reason: str | None = None  # set by the watching thread
        self._done = threading.Event()

    def before_run(self, runner: RunnerAPI) -> None:
        """The actor's lookup (a GCS call) and the outstanding call, here on the main thread
        before any step is timed; the thread then only sits in ``ray.get`` (no GIL held). Done
        in before_train, concurrently with the first steps, it made rank 0 slower in
        StragglerHook's first window (CI of 4a4cd24)."""
        if self.control is None or runner.rank != 0:
            return
        import ray

        try:
            pending: Any = ray.get_actor(str(self.control)).wait_stop.remote()
        except ValueError:  # no such actor: its driver is gone
            runner.logger.warning("Ctrl-C cannot reach this run: no actor %s", self.control)
            return
        watch = threading.Thread(
            target=self._watch, args=(pending, runner.logger), name="drun-ray-pause", daemon=True
        )
        watch.start()

    def _watch(self, pending: Any, logger: Any) -> None:
        import ray

        while not self._done.is_set():
            try:
                self._reason = ray.get(pending, timeout=self.poll_s)
                return
            except ray.exceptions.GetTimeoutError:
                continue
            except ray.exceptions.RayError as e:  # the driver's node is gone
                logger.warning("Ctrl-C cannot reach this run any more (%s)", type(e).__name__)
                return

    def after_train_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: Any = None, outputs: Any = None
    ) -> None:
        if self._reason is not None:
            reason, self._reason = self._reason, None
            runner.request_pause(reason)

    def after_run(self, runner: RunnerAPI) -> None:
        self._done.set()
