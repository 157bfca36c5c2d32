"""Where the hooked loop's cost goes in a distributed run: ray_overhead.py's comparison without
Ray, taken apart.

Two local gloo processes (one thread each, no Ray: no controller, raylet or health checks sharing
the cores), ray_overhead.py's model and data (MLP 16-64-2 under DDP, 2,048 samples, 32 per rank
batch, so 32 iterations an epoch per rank). Each Runner epoch is preceded, on both ranks, by an
epoch of the hand-written DDP loop ray_overhead.py compares with (its own model, a
``DistributedSampler``), so every pair runs back to back on the same machine state; the figure
is the median of the pairs' differences, per iteration, in rank 0's training-thread CPU time
(``time.thread_time``: the loop's own work — not gloo's threads, not the time spent waiting for
the other rank or for a core, which swing by hundreds of microseconds per iteration on a 2-core
machine) and, for comparison, in wall time. Five Runners, each with one part more:

1. no default hooks: the loop, ``DefaultSampler`` and collate, the step, the ranks' agreement
   on requests (``agree_every='auto'``);
2. + RuntimeInfoHook, IterTimerHook, ParamSchedulerHook, DistSamplerSeedHook;
3. + StragglerHook (distributed only: a forward hook on the DDP model and a step post-hook);
4. + LoggerHook's record every 10 iterations, no sinks: the window's values averaged over the
   ranks, with the straggler figures, in one all_gather;
5. + the records written (terminal line to a file, JSON line): the defaults, as ray_overhead.py
   runs them (checkpoints off).

    python benchmarks/distributed_parts.py [--rounds 16] [--epochs 11]
"""
from __future__ import annotations

import argparse
import contextlib
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

ROOT = Path(__file__).resolve().parents[1]

OFF = dict(runtime_info=None, timer=None, sampler_seed=None, logger=None, param_scheduler=None,
           checkpoint=None, straggler=None)
VARIANTS: list[tuple[str, dict]] = [
    ("loop, sampler + collate, DDP step, agreement (no default hooks)", OFF),
    ("+ RuntimeInfo, IterTimer, ParamScheduler, DistSamplerSeed hooks",
     dict(OFF, runtime_info={}, timer={}, sampler_seed={}, param_scheduler={})),
    ("+ StragglerHook's clock (forward hook, step post-hook)",
     dict(checkpoint=None, logger=None)),
    ("+ LoggerHook's record every 10 (all_gather across ranks), no sinks",
     dict(checkpoint=None, logger=dict(type="LoggerHook", interval=10, sinks=[]))),
    ("+ the records written: terminal line (to a file), JSON line",
     dict(checkpoint=None, logger=dict(type="LoggerHook", interval=10))),
]


def _worker(rank: int, port: int, rounds: int, epochs: int, out: str) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    from benchmarks.hook_overhead import epoch_by_hand
    from benchmarks.ranks import leave_rank_process
    from benchmarks.ray_overhead import BATCH, RayBenchData, RayBenchMLP
    from distributed_runner import Runner
    from hooks import Hook

    class PlainEpochs:
        """ray_overhead.py's hand-written loop, one epoch per call (both ranks, in step)."""

        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = DistributedDataParallel(RayBenchMLP(), broadcast_buffers=False)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
            self.sampler = DistributedSampler(RayBenchData(), shuffle=True, seed=0)
            self.loader = DataLoader(self.sampler.dataset, batch_size=BATCH, sampler=self.sampler)
            self.epoch_count = 0

        def epoch(self) -> tuple[float, float]:
            """(CPU, wall) seconds per iteration of one epoch."""
            self.sampler.set_epoch(self.epoch_count)
            self.epoch_count += 1
            cpu, wall = time.thread_time(), time.perf_counter()
            epoch_by_hand(self.model, self.opt, self.loader)
            n = len(self.loader)
            return (time.thread_time() - cpu) / n, (time.perf_counter() - wall) / n

    class Paired(Hook):
        priority = "HIGHEST"

        def __init__(self) -> None:
            self.plain, self.pairs = PlainEpochs(), []

        def before_train_epoch(self, runner) -> None:
            self._plain = self.plain.epoch()
            self._start = (time.thread_time(), time.perf_counter())

        def end(self, iters: int) -> None:
            cpu = (time.thread_time() - self._start[0]) / iters
            wall = (time.perf_counter() - self._start[1]) / iters
            self.pairs.append((self._plain, (cpu, wall)))

    class PairedEnd(Hook):
        priority = "LOWEST"

        def __init__(self, paired: Paired) -> None:
            self.paired = paired

        def after_train_epoch(self, runner) -> None:
            self.paired.end(len(runner.train_dataloader))

    diffs: dict[str, dict[str, list[float]]] = {
        label: {"cpu": [], "wall": [], "plain_cpu": [], "plain_wall": []} for label, _ in VARIANTS}
    for r in range(rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for label, default_hooks in order:
            paired = Paired()
            work_dir = os.path.join(out, f"r{r}-{VARIANTS.index((label, default_hooks))}")
            sink = open(os.devnull if rank else f"{work_dir}.stdout", "w")  # noqa: SIM115
            with sink, contextlib.redirect_stdout(sink):
                Runner(model=dict(type="RayBenchMLP"), work_dir=work_dir,
                       train_dataloader=dict(dataset=dict(type="RayBenchData"), batch_size=BATCH),
                       train_cfg=dict(by_epoch=True, max_epochs=epochs),
                       optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
                       default_hooks=default_hooks, custom_hooks=[paired, PairedEnd(paired)],
                       randomness=dict(seed=0), log_level="INFO").train()
            for (plain_cpu, plain_wall), (cpu, wall) in paired.pairs[1:]:  # first: warm-up
                d = diffs[label]
                d["cpu"].append(cpu - plain_cpu)
                d["wall"].append(wall - plain_wall)
                d["plain_cpu"].append(plain_cpu)
                d["plain_wall"].append(plain_wall)
    if rank == 0:
        Path(out, "result.json").write_text(json.dumps(diffs))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    leave_rank_process()


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(xs, n=4)
    return median * 1e6, q1 * 1e6, q3 * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=11)
    args = parser.parse_args()
    if (args.epochs - 1) * args.rounds < 2:  # each run's first epoch is its warm-up
        parser.error("--epochs and --rounds leave fewer than 2 pairs a Runner: "
                     "(epochs - 1) * rounds must be >= 2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(port, args.rounds, args.epochs, tmp), nprocs=2,
                           join=True, start_method="spawn")
        result = json.loads(Path(tmp, "result.json").read_text())
    n = len(result[VARIANTS[0][0]]["cpu"])
    plain_cpu = statistics.median(x for d in result.values() for x in d["plain_cpu"]) * 1e6
    plain_wall = statistics.median(x for d in result.values() for x in d["plain_wall"]) * 1e6
    print(f"distributed parts: 2 gloo processes (no Ray), ray_overhead.py's MLP and data, 32 "
          f"iters/epoch a rank; {n} pairs (plain DDP epoch, Runner epoch) per Runner, runs "
          f"interleaved; rank 0")
    print(f"plain DDP loop: training thread {plain_cpu:.1f} us/iter CPU, {plain_wall:.1f} us/iter "
          f"wall")
    print(f"{'Runner (each row: the one above plus a part)':<68} {'thread CPU over plain':>22} "
          f"{'part':>6} {'wall over plain':>24}")
    before = 0.0
    for label, _ in VARIANTS:
        cpu, c1, c3 = _quartiles(result[label]["cpu"])
        wall, w1, w3 = _quartiles(result[label]["wall"])
        print(f"{label:<68} {cpu:6.1f} ({c1:6.1f}..{c3:6.1f}) {cpu - before:+6.1f} "
              f"{wall:6.1f} ({w1:6.1f}..{w3:6.1f}) us/iter")
        before = cpu
    print(f"the defaults: training thread CPU {(plain_cpu + before) / plain_cpu:.3f}x the plain "
          f"loop's; {before:.1f} us/iter is {100 * before / plain_wall:.1f} % of its wall time")


if __name__ == "__main__":
    main()
