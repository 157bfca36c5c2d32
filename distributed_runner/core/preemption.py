"""SIGTERM (pod eviction, spot preemption): finish the step, checkpoint, exit within a bound.

While ``Runner.train()`` runs on a process's main thread, the signals in
``preemption=dict(signals=[...])`` (default ``SIGTERM``) do not kill the process. The handler
only raises a ``preempt`` request (:mod:`distributed_runner.engine.requests`); at the end of the
current iteration every rank agrees on it, writes a checkpoint (reported to Ray when under Ray),
runs ``after_train``/``after_run`` so sinks flush, and ``train()`` raises :class:`TrainingPreempted`
(``drun train`` exits with 143, the conventional SIGTERM status, so orchestrators retry).
``resume=True`` then continues exactly from that checkpoint.

A watchdog bounds the whole thing: if the process has not left ``train()`` ``grace_period``
seconds after the signal (a stuck collective, a very long step), it exits with 143 anyway —
keep ``grace_period`` below the orchestrator's own grace (Kubernetes: 30 s by default;
``terminationGracePeriodSeconds``). A second signal exits at once.

**Ctrl-C is a pause** (SIGINT, always handled while training runs on the main thread, whatever
``preemption`` says): the first one asks for the same stop — the current iteration ends, a
checkpoint is written unless this very state was just saved, sinks close (MLflow ``KILLED``) —
and ``drun train`` prints one line with the iteration reached and the command that continues,
exiting 130 (128 + SIGINT); a second Ctrl-C exits at once with 130.

Off the main thread (Ray Train runs the training function in a worker thread) Python cannot
install signal handlers; there Ray's own fault tolerance restarts from the last reported
checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from distributed_runner.core.errors import ConfigError

EXIT_CODE = 128 + signal.SIGTERM
INTERRUPT_EXIT_CODE = 128 + signal.SIGINT
INTERRUPT = "SIGINT"  # the request reason of a Ctrl-C


class TrainingPreempted(Exception):
    """Training stopped on a signal after writing a checkpoint; resume to continue."""

    def __init__(
        self, reasons: tuple[str, ...], checkpoint: Any = None, iteration: int | None = None
    ) -> None:
        self.reasons, self.checkpoint, self.iteration = reasons, checkpoint, iteration
        super().__init__(
            f"preempted ({'; '.join(reasons)}); checkpoint {checkpoint}: run again "
            f"with resume=True (--resume) to continue"
        )

    @property
    def interrupted(self) -> bool:
        """Stopped by Ctrl-C (a pause the user asked for, not an eviction)."""
        # ranks agreeing on a request name it with its rank: 'SIGINT (rank 0)'
        return any(reason.split(" ")[0] == INTERRUPT for reason in self.reasons)


def parse_preemption(cfg: Any) -> dict | None:
    """``preemption`` config -> ``{'signals': [...], 'grace_period': s}`` or None (off)."""
    if cfg is False or cfg is None:
        return None
    if cfg is not True and not isinstance(cfg, dict):
        raise ConfigError(
            "preemption",
            f"takes True, False or dict(signals=[...], grace_period=seconds), got {cfg!r}",
        )
    cfg = {} if cfg is True else dict(cfg)
    unknown = set(cfg) - {"signals", "grace_period"}
    if unknown:
        raise ConfigError(
            f"preemption.{sorted(unknown)[0]}", "unknown key; use signals= and grace_period="
        )
    signals = cfg.get("signals", ["SIGTERM"])
    if isinstance(signals, str):
        signals = [signals]
    if not isinstance(signals, (list, tuple)):
        raise ConfigError("preemption.signals", f"takes a list of signal names, got {signals!r}")
    for name in signals:
        if not hasattr(signal, str(name)):
            raise ConfigError(
                "preemption.signals", f"unknown signal {name!r} (e.g. 'SIGTERM', 'SIGUSR1')"
            )
    grace = cfg.get("grace_period", 25.0)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)):
        raise ConfigError("preemption.grace_period", f"takes seconds (> 0), got {grace!r}")
    grace = float(grace)
    if grace <= 0:
        raise ConfigError("preemption.grace_period", "must be > 0 seconds")
    return {"signals": list(signals), "grace_period": grace}


@contextlib.contextmanager
def preemption_signals(settings: dict | None, requests: Any, logger: Any) -> Iterator[None]:
    """Install the handlers for the duration of training (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if settings is None:  # preemption=False: Ctrl-C is still a pause
        with _interrupt_only(requests, logger):
            yield
        return
    watchdog: list[threading.Timer] = []

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if watchdog:  # a second signal: the user or the orchestrator insists
            logger.error("%s received again: exiting now", name)
            os._exit(EXIT_CODE)
        logger.warning(
            "%s received: finishing this step, then checkpoint and exit (within %.0f s)",
            name,
            settings["grace_period"],
        )
        requests.request("preempt", name)
        timer = threading.Timer(settings["grace_period"], _give_up, (logger, name))
        timer.daemon = True
        timer.start()
        watchdog.append(timer)

    previous = {signal.SIGINT: signal.signal(signal.SIGINT, _interrupt_handler(requests, logger))}
    for name in settings["signals"]:
        sig = getattr(signal, name)
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        for timer in watchdog:
            timer.cancel()


def _interrupt_handler(requests: Any, logger: Any) -> Any:
    """Ctrl-C: the first asks for a stop at the end of this iteration, the second exits."""
    pressed: list[bool] = []

    def handler(signum: int, frame: Any) -> None:
        if pressed:
            print("\ndrun: Ctrl-C again: exiting now, without a checkpoint", file=sys.stderr)
            os._exit(INTERRUPT_EXIT_CODE)
        pressed.append(True)
        logger.warning(
            "Ctrl-C: finishing this iteration, then checkpoint and stop (Ctrl-C again to quit "
            "at once)"
        )
        requests.request("preempt", INTERRUPT)

    return handler


@contextlib.contextmanager
def _interrupt_only(requests: Any, logger: Any) -> Iterator[None]:
    old = signal.signal(signal.SIGINT, _interrupt_handler(requests, logger))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def _give_up(logger: Any, name: str) -> None:
    logger.error(
        "%s: training did not stop within the grace period; exiting without a final "
        "checkpoint (the last saved one still resumes)",
        name,
    )
    os._exit(EXIT_CODE)
