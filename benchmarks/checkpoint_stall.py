"""How long training stalls for a checkpoint: synchronous against asynchronous saves, with DDP
(rank 0 writes one file) and FSDP (every rank writes its shards), 2 local gloo processes.

A model of ``--mb`` MB of fp32 weights (linear layers) trains with SGD and momentum (so the
checkpoint is about twice that: weights and momentum) through the Runner, a checkpoint every
``--every`` iterations. Rank 0 times every iteration from its first hook to its last one (the
save happens inside, in CheckpointHook); the stall per checkpoint is the mean time of the
iterations that saved minus the median of those that did not. With ``async_save`` the stall is
what copying the state to host memory costs; the write goes on beside training and may slow the
iterations after it (on a machine short of cores it does), so the run's extra time per
checkpoint over a run without checkpoints is printed too. Target: the asynchronous stall is at
most 10 % of the synchronous one.

    python benchmarks/checkpoint_stall.py [--mb 100] [--iters 24] [--every 6]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.ranks import leave_rank_process
from distributed_runner.core.registry import DATASETS, MODELS
from hooks import Hook

WIDTH_FOR_MB = 512  # layers of WIDTH x WIDTH; WIDTH is chosen so that they hold --mb MB


@MODELS.register_module(force=True)
class StallMLP(nn.Module):
    """``layers`` square linear layers (the FSDP units) and a 1-output head."""

    class Layer(nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.fc = nn.Linear(width, width)

        def forward(self, x):
            return F.relu(self.fc(x))

    def __init__(self, width: int, layers: int = 4) -> None:
        super().__init__()
        self.layers = nn.Sequential(*(self.Layer(width) for _ in range(layers)))
        self.head = nn.Linear(width, 1)

    def forward(self, inputs, targets=None, mode="predict"):
        out = self.head(self.layers(inputs))
        return {"loss": F.mse_loss(out, targets)} if mode == "loss" else out


@DATASETS.register_module(force=True)
class StallSamples(Dataset):
    def __init__(self, width: int, n: int = 256) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, width, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"inputs": self.x[i], "targets": self.x[i, :1]}


class IterationClock(Hook):
    """Rank 0: wall time of every iteration, first hook to last (LOWEST for the end)."""

    priority = "HIGHEST"

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.starts: list[float] = []
        self._start = 0.0

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self._start = time.perf_counter()
        self.starts.append(self._start)


class IterationClockEnd(Hook):
    priority = "LOWEST"

    def __init__(self, clock: IterationClock) -> None:
        self.clock = clock

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.clock.seconds.append(time.perf_counter() - self.clock._start)


def width_for(mb: float, layers: int = 4) -> int:
    return max(8, int((mb * 1e6 / 4 / layers) ** 0.5))


def _worker(rank: int, port: int, args: dict, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    from distributed_runner import Runner

    results = {}
    width = width_for(args["mb"])
    for strategy in ("ddp", "fsdp"):
        for asynchronous in (None, False, True):  # None: no checkpoints, the baseline
            clock = IterationClock()
            Runner(model=dict(type="StallMLP", width=width), work_dir=f"{out}/{strategy}_"
                   f"{asynchronous}", strategy=strategy if strategy == "ddp" else dict(
                       type="fsdp", shard_modules=["Layer"]),
                   train_dataloader=dict(dataset=dict(type="StallSamples", width=width),
                                         batch_size=8,
                                         sampler=dict(type="DefaultSampler", shuffle=False)),
                   train_cfg=dict(by_epoch=False, max_iters=args["iters"]),
                   optim_wrapper=dict(optimizer=dict(type="SGD", lr=1e-4, momentum=0.9)),
                   default_hooks=dict(checkpoint=None if asynchronous is None else dict(
                       type="CheckpointHook", interval=args["every"], by_epoch=False,
                       max_keep_ckpts=1, save_last=False, async_save=asynchronous)),
                   custom_hooks=[clock, IterationClockEnd(clock)], randomness=dict(seed=0),
                   log_level="WARNING").train()
            mode = {None: "none", False: "sync", True: "async"}[asynchronous]
            results[f"{strategy} {mode}"] = {
                # from the second iteration (the first builds caches) until train() returned,
                # so a background write still running at the end counts
                "iters": clock.seconds, "total": time.perf_counter() - clock.starts[1]}
    if rank == 0:
        Path(out, "results.json").write_text(json.dumps(results))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    leave_rank_process()


def stall(seconds: list[float], every: int) -> tuple[float, float]:
    """(mean stall of the saving iterations over the median other one, that median)."""
    saving = [s for i, s in enumerate(seconds, start=1) if i % every == 0]
    others = [s for i, s in enumerate(seconds, start=1) if i % every and i > 1]
    base = statistics.median(others)
    return statistics.fmean(saving) - base, base


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100.0)
    parser.add_argument("--iters", type=int, default=24)
    parser.add_argument("--every", type=int, default=6)
    args = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(dir=os.environ.get("DRUN_BENCH_DIR")) as out:
        mp.spawn(_worker, args=(port, vars(args), out), nprocs=2, join=True)
        results = json.loads(Path(out, "results.json").read_text())
        width = width_for(args.mb)
        params = 4 * (width * width + width) + width + 1
        print(f"checkpoint stall: {params * 4 / 1e6:.0f} MB of weights (+ as much momentum), "
              f"a checkpoint every {args.every} of {args.iters} iterations, 2 gloo processes, "
              f"in {out.rsplit('/', 1)[0]}")
        saves = args.iters // args.every
        for strategy in ("ddp", "fsdp"):
            base = results[f"{strategy} none"]["total"]
            parts, figures = [], {}
            for mode in ("sync", "async"):
                run = results[f"{strategy} {mode}"]
                pause, _ = stall(run["iters"], args.every)
                cost = (run["total"] - base) / saves
                figures[mode] = (pause, cost)
                parts.append(f"{mode}: stall {pause * 1e3:6.1f} ms, run +{cost * 1e3:6.1f} ms")
            (sync_pause, sync_cost), (async_pause, async_cost) = figures["sync"], figures["async"]
            print(f"{strategy:4} | per checkpoint, {' | '.join(parts)} | async/sync: stall "
                  f"{async_pause / sync_pause:.3f}, run {async_cost / sync_cost:.3f} | no "
                  f"checkpoints: run {base:.1f} s")


if __name__ == "__main__":
    main()
