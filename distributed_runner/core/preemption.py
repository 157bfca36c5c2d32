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

Off the main thread (Ray Train runs the training function in a worker thread) Python cannot
install signal handlers; there Ray's own fault tolerance restarts from the last reported
checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

from distributed_runner.core.errors import ConfigError

EXIT_CODE = 128 + signal.SIGTERM


class TrainingPreempted(Exception):
    """Training stopped on a signal after writing a checkpoint; resume to continue."""

    def __init__(self, reasons: tuple[str, ...], checkpoint: Any = None) -> None:
        self.reasons, self.checkpoint = reasons, checkpoint
        super().__init__(
            f"preempted ({'; '.join(reasons)}); checkpoint {checkpoint}: run again "
            f"with resume=True (--resume) to continue"
        )


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
    if settings is None or threading.current_thread() is not threading.main_thread():
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

    previous = {}
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


def _give_up(logger: Any, name: str) -> None:
    logger.error(
        "%s: training did not stop within the grace period; exiting without a final "
        "checkpoint (the last saved one still resumes)",
        name,
    )
    os._exit(EXIT_CODE)
