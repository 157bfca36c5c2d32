"""What agreeing on requests costs: the hooked loop on 2 local gloo processes (no Ray), the same
run with ``train_cfg.agree_every`` = 1 (an all-reduce after every iteration), ``'auto'`` (the
default) and never (``10**9``), interleaved, side by side in one run.

Every run trains the toy MLP of the tests (batch 4, 250 iterations per rank, default hooks,
logger every 50, no checkpoints); epochs are timed on rank 0, the first 40 iterations of each run
are left out (``'auto'`` probes during its first 20). Printed: median us/iter of each setting,
its ratio to "never", and the interval 'auto' chose.

    python benchmarks/agreement_overhead.py [--rounds 4]
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

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = (1, "auto", 10**9)


def _worker(rank: int, port: int, rounds: int, out: str) -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.ranks import leave_rank_process
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    import tests.toy  # noqa: F401  (ToyDataset, ToyModel)
    from distributed_runner import Runner
    from hooks import Hook
    from tests.toy import base_cfg

    class Clock(Hook):
        priority = "LOWEST"

        def __init__(self) -> None:
            self.stamps: list[float] = []

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
            self.stamps.append(time.perf_counter())

    results: dict[str, list[float]] = {str(s): [] for s in SETTINGS}
    chosen = []
    for r in range(rounds):
        order = SETTINGS if r % 2 == 0 else SETTINGS[::-1]
        for setting in order:
            clock = Clock()
            runner = Runner.from_cfg(base_cfg(
                os.path.join(out, f"wd{rank}"), val_dataloader=None, val_evaluator=None,
                val_cfg=None, train_cfg=dict(by_epoch=True, max_epochs=1, agree_every=setting),
                train_dataloader=dict(dataset=dict(type="ToyDataset", n=2000), batch_size=4,
                                      sampler=dict(type="DefaultSampler", shuffle=True)),
                default_hooks=dict(checkpoint=None,
                                   logger=dict(type="LoggerHook", interval=50, sinks=[])),
                custom_hooks=[clock]))
            runner.train()
            steps = [b - a for a, b in zip(clock.stamps[40:], clock.stamps[41:])]
            results[str(setting)].extend(steps)
            if setting == "auto":
                chosen.append(runner.requests.agree_n)
    if rank == 0:
        Path(out, "result.json").write_text(json.dumps({"per_iter": results, "auto": chosen}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    leave_rank_process()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(port, args.rounds, tmp), nprocs=2, join=True,
                           start_method="spawn")
        result = json.loads(Path(tmp, "result.json").read_text())
    never = statistics.median(result["per_iter"][str(10**9)])
    print(f"2 gloo processes, toy MLP, 250 iterations a run, {args.rounds} rounds interleaved")
    for setting in SETTINGS:
        median = statistics.median(result["per_iter"][str(setting)])
        label = {1: "agree after every iteration", "auto": "agree_every='auto' (default)",
                 10**9: "never agree after iterations"}[setting]
        print(f"{label:<30}: {median * 1e6:7.1f} us/iter | ratio to never {median / never:.3f}")
    print(f"'auto' chose every {result['auto']} iterations")


if __name__ == "__main__":
    main()
