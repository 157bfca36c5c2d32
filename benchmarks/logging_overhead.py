"""What logging every iteration to MLflow costs the training step, side by side with no logging.

The digits CNN example (batch 32, AdamW, one thread) trains with LoggerHook writing every
iteration (``interval=1``) to an MLflowSink backed by a SQLite store (a synchronous
``log_metric`` to it costs tens of milliseconds here), against the same run with the logger
removed. Runs alternate; every epoch after the first is timed on its own; medians are compared.
The sink's background thread sends batches; the step only appends to a bounded buffer.

    python benchmarks/logging_overhead.py [--epochs 6] [--pairs 4]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from distributed_runner import Config, Runner  # noqa: E402
from distributed_runner.sinks.mlflow import MLflowSink  # noqa: E402
from hooks import Hook  # noqa: E402


class EpochTimes(Hook):
    """Per-iteration seconds of each epoch after the first (outermost at both ends)."""

    priority = "HIGHEST"

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._t = 0.0

    def before_train_epoch(self, runner) -> None:
        self._t = time.perf_counter()


class EpochTimesEnd(Hook):
    priority = "LOWEST"

    def __init__(self, start: EpochTimes) -> None:
        self.start = start

    def after_train_epoch(self, runner) -> None:
        if runner.epoch > 0:
            self.start.samples.append((time.perf_counter() - self.start._t)
                                      / len(runner.train_dataloader))


def run(work_dir: Path, epochs: int, mlflow: bool) -> tuple[list[float], int]:
    cfg = Config.fromfile(ROOT / "configs" / "digits_cnn.py")
    cfg.work_dir = str(work_dir)
    cfg.train_cfg = dict(by_epoch=True, max_epochs=epochs)
    cfg.val_dataloader = cfg.val_evaluator = cfg.val_cfg = None
    cfg.test_dataloader = cfg.test_evaluator = cfg.test_cfg = None
    cfg.log_level = "WARNING"
    if mlflow:
        cfg.default_hooks = dict(checkpoint=None, logger=dict(
            type="LoggerHook", interval=1, sinks=[dict(
                type="MLflowSink", tracking_uri=f"sqlite:///{work_dir / 'mlflow.db'}")]))
    else:
        cfg.default_hooks = dict(checkpoint=None, logger=None)
    start = EpochTimes()
    cfg.custom_hooks = [start, EpochTimesEnd(start)]
    runner = Runner.from_cfg(cfg)
    runner.train()
    sink = runner.sinks.of_type(MLflowSink) if mlflow else None
    return start.samples, sink.dropped if sink is not None else 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--pairs", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    off, on, dropped = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp) / "warm", 2, mlflow=True)
        for i in range(args.pairs):
            order = [(False, off), (True, on)]
            for mlflow, sink in (order if i % 2 == 0 else order[::-1]):
                samples, lost = run(Path(tmp) / f"run{i}-{int(mlflow)}", args.epochs, mlflow)
                sink.extend(samples)
                dropped += lost
    a, b = statistics.median(off), statistics.median(on)
    print(f"digits CNN, batch 32, 45 iterations an epoch, {args.epochs} epochs a run, "
          f"{args.pairs} runs each (alternating), 1 thread")
    print(f"logging off              : {a * 1e6:8.1f} us/iter")
    print(f"MLflow sink, interval 1  : {b * 1e6:8.1f} us/iter   ratio {b / a:.3f} "
          f"(target <= 1.02); {dropped} metrics dropped (a full buffer drops them)")


if __name__ == "__main__":
    main()
