"""Training with asynchronous validation against in-loop validation, side by side: the digits
example (configs/digits_cnn.py) with a slow-ish validation — the validation images repeated
``--val-repeat`` times, real work on the CPU — every epoch.

Each round trains the same config twice in this process, ``val_cfg=dict()`` (in-loop) then
``val_cfg=dict(mode='async')`` (a background process validates each epoch's checkpoint while
training goes on; the results are applied one epoch later). A hook on rank 0 stamps the start of
every training iteration; it reports, per mode:

* ``step``: the median time from one iteration's start to the next within an epoch — what a
  validation running beside training costs each step (both processes share the machine);
* ``due``: the median time training stood still at an epoch end validation is due at, beyond one
  step (in-loop: the validation; async: saving the checkpoint, handing it over, applying the
  result of the previous one), and ``most``, the longest (async: the first result, waited for
  while the validation process starts: imports and builds its Runner);
* ``loop``: wall time from the first to the last training iteration;
* ``wall``: the whole ``train()``, including (async) the wait for the last validations.

Every process is pinned to one thread (``OMP_NUM_THREADS=1``, set before torch loads, inherited
by the validation process), so training and validation each take one core as they would their
own devices.

    python benchmarks/async_validation.py [--epochs 16] [--width 48] [--val-interval 2]
        [--val-repeat 20] [--rounds 2]
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads (module docstring)

import argparse
import itertools
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from torch.utils.data import ConcatDataset

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from distributed_runner.core.registry import DATASETS, HOOKS  # noqa: E402
from hooks import Hook  # noqa: E402


@DATASETS.register_module(force=True)
class RepeatedDigits(ConcatDataset):
    """The digits' validation split ``times`` times over: a validation that takes a while."""

    def __init__(self, times: int = 30) -> None:
        from distributed_runner.examples.digits import DigitsDataset

        super().__init__([DigitsDataset(split="val")] * int(times))


@HOOKS.register_module(force=True)
class IterStartClock(Hook):
    """Rank 0: ``perf_counter()`` at the start of every training iteration, by epoch."""

    priority = "HIGHEST"

    def __init__(self) -> None:
        self.starts: list[tuple[int, float]] = []

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.starts.append((runner.epoch, time.perf_counter()))


def config(work_dir: str, args: argparse.Namespace, mode: str) -> dict:
    from distributed_runner.core.config import Config

    cfg = Config.fromfile(ROOT / "configs" / "digits_cnn.py")
    cfg["custom_imports"] = dict(imports=["distributed_runner.examples.digits",
                                          "benchmarks.async_validation"])
    cfg["work_dir"] = work_dir
    cfg["log_level"] = "WARNING"
    cfg["model"] = dict(cfg["model"], width=args.width)
    cfg["train_cfg"] = dict(by_epoch=True, max_epochs=args.epochs, val_interval=args.val_interval)
    cfg["val_dataloader"] = dict(cfg["val_dataloader"],
                                 dataset=dict(type="RepeatedDigits", times=args.val_repeat))
    cfg["val_cfg"] = dict(mode="async") if mode == "async" else dict()
    cfg["param_scheduler"] = None
    cfg["test_dataloader"] = cfg["test_evaluator"] = cfg["test_cfg"] = None
    cfg["default_hooks"] = dict(
        logger=dict(type="LoggerHook", interval=20, sinks=["jsonl"]),
        checkpoint=dict(type="CheckpointHook", interval=1, max_keep_ckpts=2,
                        save_best="accuracy"))
    cfg["custom_hooks"] = [dict(type="IterStartClock")]
    return cfg


def measure(args: argparse.Namespace, mode: str) -> dict:
    from distributed_runner.engine.runner import Runner

    work_dir = tempfile.mkdtemp(prefix=f"drun-async-val-{mode}-")
    try:
        runner = Runner.from_cfg(config(work_dir, args, mode))
        start = time.perf_counter()
        runner.train()
        wall = time.perf_counter() - start
        starts = runner.get_hook("iter_start_clock").starts
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    pairs = list(itertools.pairwise(starts))
    within = [b - a for (ea, a), (eb, b) in pairs if ea == eb]
    # the gaps across an epoch end that validation is due at
    across = [b - a for (ea, a), (eb, b) in pairs if ea != eb and eb % args.val_interval == 0]
    step = statistics.median(within)
    return {"step": step, "due": statistics.median(across) - step, "first": across[0] - step,
            "most": max(across) - step,
            "loop": starts[-1][1] - starts[0][1], "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--width", type=int, default=48, help="DigitsCNN's width")
    parser.add_argument("--val-interval", type=int, default=2, help="epochs")
    parser.add_argument("--val-repeat", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    print(f"async validation: digits CNN width {args.width}, {args.epochs} epochs of 45 "
          f"iterations, validating {360 * args.val_repeat} images every {args.val_interval} "
          f"epoch(s); OMP_NUM_THREADS="
          f"{os.environ['OMP_NUM_THREADS']}; {args.rounds} round(s), each mode once per round")
    runs: dict[str, list[dict]] = {"inline": [], "async": []}
    for _ in range(args.rounds):
        for mode in runs:
            runs[mode].append(measure(args, mode))
    for mode, results in runs.items():
        cells = "  ".join(
            f"{key} " + " / ".join(
                f"{r[key] * 1e3:.1f} ms" if key == "step" else f"{r[key]:.2f} s" for r in results)
            for key in ("step", "due", "most", "loop", "wall"))
        print(f"{mode:6s}  {cells}")
    pairs = list(zip(runs["async"], runs["inline"], strict=True))
    ratio = [a["loop"] / i["loop"] for a, i in pairs]
    step = [a["step"] / i["step"] for a, i in pairs]
    print("async/inline: training loop " + " / ".join(f"{r:.2f}" for r in ratio)
          + "x, step time " + " / ".join(f"{r:.2f}" for r in step) + "x")


if __name__ == "__main__":
    main()
