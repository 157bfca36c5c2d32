"""Test-only components for the hook library (also imported on Ray workers through
``custom_imports=['tests.hook_probes']``): a metric that reports a scripted sequence, a model whose
loss turns NaN at chosen steps, and hooks that raise requests or signals on one rank."""
from __future__ import annotations

import os
import signal
import time

import torch

import tests.toy  # noqa: F401  (ToyDataset / ToyModel)
from distributed_runner.core.registry import HOOKS, METRICS, MODELS
from distributed_runner.evaluation.evaluator import BaseMetric
from hooks import Hook
from tests.toy import ToyModel


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


@METRICS.register_module(force=True)
class SeqMetric(BaseMetric):
    """Reports ``values[n]`` as ``score`` at its n-th evaluation (counted from ``start``)."""

    def __init__(self, values=(), start: int = 0) -> None:
        super().__init__()
        self.values, self.n = list(values), int(start)

    def process(self, data_batch, outputs) -> None:
        self.results.append(0)

    def compute(self, results) -> dict:
        value = self.values[min(self.n, len(self.values) - 1)]
        self.n += 1
        return {"score": value}


@MODELS.register_module(force=True)
class NanModel(ToyModel):
    """ToyModel whose training loss is NaN at the training forwards numbered in ``nan_at``
    (1-based; the counter is not part of any checkpoint) on ``nan_rank`` (None: every rank)."""

    def __init__(self, nan_at=(), nan_rank=None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.nan_at, self.nan_rank, self.forwards = set(nan_at), nan_rank, 0

    def forward(self, inputs, labels=None, index=None, mode="predict"):
        out = super().forward(inputs, labels, index, mode)
        if mode == "loss":
            self.forwards += 1
            if self.forwards in self.nan_at and self.nan_rank in (None, _rank()):
                out["loss"] = out["loss"] * float("nan")
        return out


@HOOKS.register_module(force=True)
class RequestHook(Hook):
    """Calls ``runner.request_<kind>(reason)`` after iteration ``at_iter`` on rank ``rank``;
    ``kind='stop_training'`` sets MMEngine's flag, ``runner.train_loop.stop_training = True``,
    as MMEngine's hooks do."""

    def __init__(self, kind: str = "stop", at_iter: int = 1, rank=None) -> None:
        self.kind, self.at_iter, self.rank = kind, at_iter, rank

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.at_iter and self.rank in (None, runner.rank):
            if self.kind == "stop_training":
                runner.train_loop.stop_training = True
            else:
                getattr(runner, f"request_{self.kind}")(f"test {self.kind} at {self.at_iter}")


@HOOKS.register_module(force=True)
class SignalHook(Hook):
    """Sends ``sig`` to its own process after iteration ``at_iter`` (once per work_dir)."""

    def __init__(self, at_iter: int = 1, sig: str = "SIGTERM") -> None:
        self.at_iter, self.sig = at_iter, sig

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        marker = runner.work_dir / "signalled"
        if runner.iter + 1 == self.at_iter and not marker.exists():
            marker.write_text("1")
            os.kill(os.getpid(), getattr(signal, self.sig))


@HOOKS.register_module(force=True)
class CrashAtHook(Hook):
    """Raises after iteration ``at_iter``: a run that fails."""

    def __init__(self, at_iter: int) -> None:
        self.at_iter = at_iter

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.at_iter:
            raise RuntimeError("simulated crash")


@HOOKS.register_module(force=True)
class SleepHook(Hook):
    """Sleeps ``seconds`` after every training iteration (a slow hook)."""

    def __init__(self, seconds: float = 0.01) -> None:
        self.seconds = seconds

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        time.sleep(self.seconds)


@HOOKS.register_module(force=True)
class ControlDumpHook(Hook):
    """After training, each rank writes what the loop acted on and its final weights."""

    priority = "LOWEST"

    def after_train(self, runner) -> None:
        import json
        guard = runner.get_hook("non_finite_loss")
        out = {"iter": runner.iter, "log": [[i, k, list(r)] for i, k, r in runner.requests.log],
               "events": guard.events if guard is not None else None,
               "lr": runner.optim_wrapper.get_lr()[0],
               "weights": {k: v.tolist() for k, v in runner.model.state_dict().items()
                           if k.endswith("weight")}}
        (runner.work_dir / f"control_rank{runner.rank}.json").write_text(json.dumps(out))


@HOOKS.register_module(force=True)
class TouchHook(Hook):
    """Writes ``work_dir/trained_<iter>`` after each training iteration: a test outside the
    process sees training running."""

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        (runner.work_dir / f"trained_{runner.iter + 1}").touch()
