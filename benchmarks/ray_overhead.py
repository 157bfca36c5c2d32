"""The hooked loop on Ray Train against a plain Ray Train loop, side by side in one run.

Both train the same tiny MLP with DDP on 2 CPU workers (gloo; ``--gpu`` for NCCL on GPUs) over the
same data (2,048 samples, 32 per worker batch, rank-sharded), SGD. Ours runs the Runner with the
default hooks (logger every 10 iterations, checkpoints off, so no ``ray.train.report`` in the
loop); the plain loop is what a Ray Train user writes by hand. Printed:

* steady-state seconds per iteration (median over epochs 2.. of every run, rank 0) and the ratio
  (target <= 1.03);
* the training thread's own CPU time per iteration of each (rank 0, ``time.thread_time``): the
  work each loop does, free of the waiting (for the other rank, for a core) that makes the wall
  time swing on a small machine — where the framework's cost shows with less noise;
* seconds from ``fit()`` to the first training iteration of each (target: ours <= plain + 2 s) —
  worker start-up, process group, and for ours: config, Runner construction, hook plan.

On a 2-core machine the workers share the cores with Ray's own processes and single epochs swing
by +-30 %: hence many epochs per run, alternating runs, medians, and the quartiles printed beside.

    python benchmarks/ray_overhead.py [--epochs 20] [--pairs 4] [--gpu]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from distributed_runner.core.registry import DATASETS, HOOKS, MODELS  # noqa: E402
from hooks import Hook  # noqa: E402

N, FEATURES, BATCH = 2048, 16, 32


@DATASETS.register_module(force=True)
class RayBenchData(Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(N, FEATURES, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict:
        return {"inputs": self.x[i], "labels": self.y[i]}


@MODELS.register_module(force=True)
class RayBenchMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(FEATURES, 64), nn.Linear(64, 2)

    def forward(self, inputs, labels=None, mode="predict"):
        logits = self.fc2(F.relu(self.fc1(inputs)))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, labels)}
        return logits


class Timeline:
    """Rank 0's timestamps: first iteration, and per-iteration time of each epoch after the first."""

    def __init__(self, out: str, fit_time: float) -> None:
        self.out, self.fit_time = out, fit_time
        self.first_iter: float | None = None
        self.per_iter: list[float] = []
        # the training thread's own CPU seconds: its work, without the time it waits for the
        # other rank or for a core (time.thread_time; gloo's threads are not in it)
        self.cpu_per_iter: list[float] = []
        self._epoch_start = self._epoch_cpu = 0.0
        self._epoch = 0

    def iteration(self) -> None:
        if self.first_iter is None:
            self.first_iter = time.time()

    def epoch_start(self) -> None:
        self._epoch_start, self._epoch_cpu = time.perf_counter(), time.thread_time()

    def epoch_end(self, iters: int) -> None:
        if self._epoch > 0:
            self.per_iter.append((time.perf_counter() - self._epoch_start) / iters)
            self.cpu_per_iter.append((time.thread_time() - self._epoch_cpu) / iters)
        self._epoch += 1

    def save(self) -> None:
        Path(self.out).write_text(json.dumps({"to_first_iter": self.first_iter - self.fit_time,
                                              "per_iter": self.per_iter,
                                              "cpu_per_iter": self.cpu_per_iter}))


@HOOKS.register_module(force=True)
class TimelineHook(Hook):
    """Ours: the same timestamps from mount points (first at epoch start, last at epoch end)."""

    priority = "HIGHEST"

    def __init__(self, out: str, fit_time: float) -> None:
        self.timeline = Timeline(out, fit_time)

    def before_train_epoch(self, runner) -> None:
        self.timeline.epoch_start()

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self.timeline.first_iter is None:
            self.timeline.iteration()

    def after_train(self, runner) -> None:
        if runner.rank == 0:
            self.timeline.save()


@HOOKS.register_module(force=True)
class TimelineEndHook(Hook):
    priority = "LOWEST"

    def after_train_epoch(self, runner) -> None:
        timeline = runner.get_hook("timeline").timeline
        timeline.epoch_end(len(runner.train_dataloader))


def plain_loop(config: dict) -> None:
    """A hand-written Ray Train loop: DDP, DistributedSampler, SGD."""
    import ray.train
    import ray.train.torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    timeline = Timeline(config["out"], config["fit_time"])
    device = ray.train.torch.get_device()
    model = DistributedDataParallel(RayBenchMLP().to(device), broadcast_buffers=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sampler = DistributedSampler(RayBenchData(), shuffle=True, seed=0)
    loader = DataLoader(sampler.dataset, batch_size=BATCH, sampler=sampler)
    for epoch in range(config["epochs"]):
        sampler.set_epoch(epoch)
        timeline.epoch_start()
        model.train()
        for batch in loader:
            timeline.iteration()
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch, mode="loss")["loss"]
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        timeline.epoch_end(len(loader))
    if dist.get_rank() == 0:
        timeline.save()


def run_plain(epochs: int, use_gpu: bool, out: str) -> dict:
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    fit_time = time.time()
    TorchTrainer(plain_loop,
                 train_loop_config={"epochs": epochs, "out": out, "fit_time": fit_time},
                 scaling_config=ray.train.ScalingConfig(num_workers=2, use_gpu=use_gpu),
                 run_config=ray.train.RunConfig(storage_path=str(Path(out).parent / "plain")),
                 torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo")).fit()
    return json.loads(Path(out).read_text())


def run_ours(epochs: int, use_gpu: bool, out: str, agree_every: int | str = "auto") -> dict:
    from distributed_runner.launch.launcher import RayLauncher, normalize_launcher

    work_dir = Path(out).parent / f"ours-{time.time_ns()}"
    fit_time = time.time()
    cfg = dict(
        work_dir=str(work_dir), custom_imports=dict(imports=["benchmarks.ray_overhead"]),
        model=dict(type="RayBenchMLP"),
        train_dataloader=dict(dataset=dict(type="RayBenchData"), batch_size=BATCH),
        train_cfg=dict(by_epoch=True, max_epochs=epochs, agree_every=agree_every),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        default_hooks=dict(logger=dict(type="LoggerHook", interval=10), checkpoint=None),
        custom_hooks=[dict(type="TimelineHook", name="timeline", out=out, fit_time=fit_time),
                      dict(type="TimelineEndHook")],
        randomness=dict(seed=0), log_level="WARNING",
        launcher=dict(type="ray", num_workers=2, use_gpu=use_gpu))
    launcher = RayLauncher(cfg, normalize_launcher(cfg["launcher"]))
    if launcher.train() != 0:
        raise RuntimeError("the hooked run failed")
    return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--agree-every", default="auto",
                        help="train_cfg.agree_every of the hooked run: 'auto' or an int")
    args = parser.parse_args()
    if (args.epochs - 1) * args.pairs < 2:  # each run's first epoch is its warm-up
        parser.error("--epochs and --pairs leave fewer than 2 timed epochs a side: "
                     "(epochs - 1) * pairs must be >= 2")
    agree = args.agree_every if args.agree_every == "auto" else int(args.agree_every)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    plain, ours = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            order = [("plain", run_plain, plain),
                     ("ours", functools.partial(run_ours, agree_every=agree), ours)]
            for name, fn, sink in (order if i % 2 == 0 else order[::-1]):
                sink.append(fn(args.epochs, args.gpu, f"{tmp}/{name}{i}.json"))
    ray.shutdown()
    all_plain = [x for r in plain for x in r["per_iter"]]
    all_ours = [x for r in ours for x in r["per_iter"]]
    per_plain, per_ours = statistics.median(all_plain), statistics.median(all_ours)
    q_plain = statistics.quantiles(all_plain, n=4)
    q_ours = statistics.quantiles(all_ours, n=4)
    cpu_plain = statistics.median(x for r in plain for x in r["cpu_per_iter"])
    cpu_ours = statistics.median(x for r in ours for x in r["cpu_per_iter"])
    first_plain = statistics.median(r["to_first_iter"] for r in plain)
    first_ours = statistics.median(r["to_first_iter"] for r in ours)
    device = "GPU (NCCL)" if args.gpu else "CPU (gloo)"
    print(f"2 workers, {device}, {N // 2 // BATCH} iterations an epoch per worker, {args.epochs} "
          f"epochs, {args.pairs} runs each (alternating)")
    print(f"steady state : plain Ray Train {per_plain * 1e6:8.1f} us/iter | hooked Runner "
          f"{per_ours * 1e6:8.1f} us/iter | ratio {per_ours / per_plain:.3f} (target <= 1.03)")
    print(f"  quartiles (us/iter): plain {q_plain[0] * 1e6:.0f}..{q_plain[2] * 1e6:.0f}, hooked "
          f"{q_ours[0] * 1e6:.0f}..{q_ours[2] * 1e6:.0f}; {len(all_plain)} epochs each")
    print(f"  training thread's CPU time (its own work, no waiting): plain {cpu_plain * 1e6:.1f}, "
          f"hooked {cpu_ours * 1e6:.1f} us/iter (+{(cpu_ours - cpu_plain) * 1e6:.1f})")
    print(f"(train_cfg.agree_every={agree!r})")
    print(f"fit() -> first iteration : plain {first_plain:6.2f} s | hooked {first_ours:6.2f} s | "
          f"difference {first_ours - first_plain:+.2f} s (target <= +2 s)")


if __name__ == "__main__":
    main()
