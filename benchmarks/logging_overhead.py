"""What logging every iteration to MLflow costs the training step, side by side with no logging.

The digits CNN example (batch 32, AdamW, one thread) trains with LoggerHook writing every
iteration (``interval=1``) to an MLflowSink backed by a SQLite store (a synchronous
``log_metric`` to it costs tens of milliseconds here), against the same run with the logger
removed. Runs alternate; every epoch after the first is timed on its own; medians are compared,
and each pair's (its two runs back to back) ratio is printed, to show the noise between runs.
The sender is a process of its own; the step only hands metrics over. Its start (a fresh
interpreter importing mlflow and opening the store: 3-4 s of CPU on another core here) overlaps
the first epoch, which is not timed, and ``runner.sinks.flush()`` at the end of that epoch waits
for it, as a checkpoint would: on a 2-core machine that start slowed the concurrent epochs by
15-20 %, a one-off of a few seconds per run, which a 6-epoch run would otherwise report as the
cost of every step.

    python benchmarks/logging_overhead.py [--epochs 6] [--pairs 4]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from distributed_runner import Config, Runner  # noqa: E402
from distributed_runner.tracking.sinks.mlflow import MLflowSink  # noqa: E402
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
        if runner.epoch == 0:  # the sender process has started and opened the run (as before a
            runner.sinks.flush()  # checkpoint): what follows is the steady state
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
            # the wait for the sender at the first epoch's end is epoch_times_end's time: known
            type="LoggerHook", interval=1, hook_time_warn_share=1.0, sinks=[dict(
                type="MLflowSink", tracking_uri=f"sqlite:///{work_dir / 'mlflow.db'}")]))
    else:
        cfg.default_hooks = dict(checkpoint=None, logger=None)
    start = EpochTimes()
    cfg.custom_hooks = [start, EpochTimesEnd(start)]
    runner = Runner.from_cfg(cfg)
    # in work_dir: MLflow puts a SQLite store's artifacts under ./mlruns of the current folder
    with contextlib.chdir(work_dir):
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
    pair_ratios = []  # each pair's runs back to back: their ratio is free of the drift between
    with tempfile.TemporaryDirectory() as tmp:
        run(Path(tmp) / "warm", 2, mlflow=True)
        for i in range(args.pairs):
            medians = {}
            order = [(False, off), (True, on)]
            for mlflow, times in (order if i % 2 == 0 else order[::-1]):
                samples, lost = run(Path(tmp) / f"run{i}-{int(mlflow)}", args.epochs, mlflow)
                times.extend(samples)
                medians[mlflow] = statistics.median(samples)
                dropped += lost
            pair_ratios.append(medians[True] / medians[False])
    a, b = statistics.median(off), statistics.median(on)
    print(f"digits CNN, batch 32, 45 iterations an epoch, {args.epochs} epochs a run, "
          f"{args.pairs} runs each (alternating), 1 thread")
    print(f"logging off              : {a * 1e6:8.1f} us/iter")
    print(f"MLflow sink, interval 1  : {b * 1e6:8.1f} us/iter   ratio {b / a:.3f} "
          f"(target <= 1.02); {dropped} metrics dropped (a full buffer drops them)")
    print(f"per pair of runs         : ratios {' '.join(f'{r:.3f}' for r in pair_ratios)}, "
          f"median {statistics.median(pair_ratios):.3f}")


if __name__ == "__main__":
    main()
