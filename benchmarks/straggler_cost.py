"""What StragglerHook adds to each iteration of a distributed run (on the path without a record).

A single process attaches nothing, so ``benchmarks/hook_overhead.py`` shows no change; this
measures the distributed path on its own, with a DDP-wrapped MLP (16 -> 32 -> 2, batch 32) in a
one-rank gloo group, one thread: the two calls the straggler clock hooks into, with its torch
hooks attached and without — the wrapped model's forward (a forward hook) and
``optimizer.step()`` (a step post-hook) — each the minimum over repeats of many calls. Their sum
is the cost per iteration. (Whole iterations, about 200 us here, vary by +-5 us from one
measurement to the next on a shared machine, more than the cost itself.) At a record
LoggerHook's all_gather replaces its all-reduce (no extra collective); not timed here.

    python benchmarks/straggler_cost.py [--calls 5000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import timeit
from pathlib import Path

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hooks.straggler_hook import PreCollectiveClock


def one_rank_group() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch_dist.init_process_group("gloo", rank=0, world_size=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    one_rank_group()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 16), torch.randint(0, 2, (32,))
    for _ in range(100):  # warm-up (DDP rebuilds its buckets), and gradients for the step
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    clock = PreCollectiveClock()
    print("straggler clock, DDP one-rank gloo, one thread")
    total = 0.0
    for name, call in {"forward": lambda: model(x), "optimizer.step": opt.step}.items():
        times = {}
        for attached in (False, True, False, True):
            if attached:
                clock.attach(model, opt, at_forward_start=False)
            best = min(timeit.repeat(call, number=args.calls, repeat=args.repeats))
            clock.detach()
            times[attached] = min(times.get(attached, best), best) / args.calls * 1e6
        total += times[True] - times[False]
        print(
            f"{name}: {times[False]:.2f} -> {times[True]:.2f} us "
            f"({times[True] - times[False]:+.2f})"
        )
    print(f"per iteration: {total:+.2f} us")
    torch_dist.destroy_process_group()


if __name__ == "__main__":
    main()
