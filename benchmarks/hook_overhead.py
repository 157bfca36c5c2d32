"""What the hooked Runner costs per iteration, next to a bare PyTorch loop doing the same work.

**The user's path (the headline figure).** A per-sample dataset of dict samples, the Runner's own
``DefaultSampler(shuffle=False)`` and collate, the seven default hooks (logger every 10 iterations
writing terminal and JSON-lines records at INFO, stdout sent to a file as ``drun train > out.log``
does; checkpoints off), an MLP 32 -> 32 -> 1 with batch 16 —
against a bare loop over a plain ``DataLoader(dataset, batch_size=16)`` of the same dataset, one
thread. Each Runner epoch is preceded by a bare epoch in the same process (:class:`PairedEpochs`);
the figure is the median of the pairs' differences in process CPU time. Target: <= 15 us/iter.
Where it goes, part by part: ``benchmarks/overhead_parts.py``.

**Pre-batched.** The same comparison with a tiny MLP (16 -> 32 -> 2) on ready-made batches (a
DataLoader with ``batch_size=None``), so that collation is out of the picture; runs alternate
(ABBA), every epoch after a run's first timed on its own, medians and minima printed.

Then: the default hooks' two per-iteration mount points called directly with no model, and one
mount point called on a dispatcher holding 50 hooks of which 2 implement it, against one holding
only those 2.

    python benchmarks/hook_overhead.py [--user-rounds 6] [--epochs 5] [--repeats 60] [--only-user-path]
        [--log-level INFO]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.dispatch_cost import print_dispatch_costs
from distributed_runner import Runner
from distributed_runner.core.registry import DATASETS, MODELS
from hooks import Hook

BATCHES, BATCH, FEATURES = 16, 32, 16


@DATASETS.register_module(force=True)
class BenchBatches(Dataset):
    """64 ready-made batches: item ``i`` is ``{'inputs': [32, 16], 'labels': [32]}``."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(BATCHES, BATCH, FEATURES, generator=g)
        self.items = [{"inputs": x[i], "labels": (x[i, :, 0] > 0).long()} for i in range(BATCHES)]

    def __len__(self) -> int:
        return BATCHES

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


@MODELS.register_module(force=True)
class BenchMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(FEATURES, 32), nn.Linear(32, 2)

    def forward(self, inputs, labels=None, mode="predict"):
        logits = self.fc2(F.relu(self.fc1(inputs)))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, labels)}
        return logits


def identity(item):
    return item


class EpochClock:
    """Per-iteration (wall, cpu) seconds of every epoch after the first."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._t: tuple[float, float] | None = None
        self._epoch = 0

    def epoch_start(self) -> None:
        self._t = (time.perf_counter(), time.process_time())

    def epoch_end(self, iters: int = BATCHES) -> None:
        if self._epoch > 0:
            wall, cpu = self._t
            self.samples.append(((time.perf_counter() - wall) / iters,
                                 (time.process_time() - cpu) / iters))
        self._epoch += 1


class EpochClockHook(Hook):
    """The Runner's side of the clock: outermost at epoch start and end, nothing per iteration."""

    priority = "HIGHEST"

    def __init__(self, clock: EpochClock) -> None:
        self.clock = clock

    def before_train_epoch(self, runner) -> None:
        self.clock.epoch_start()


class EpochClockEndHook(Hook):
    priority = "LOWEST"

    def __init__(self, clock: EpochClock, iters: int = BATCHES) -> None:
        self.clock, self.iters = clock, iters

    def after_train_epoch(self, runner) -> None:
        self.clock.epoch_end(self.iters)


def epoch_by_hand(model: nn.Module, opt: torch.optim.Optimizer, loader: Iterable) -> None:
    """One epoch of the loop users write by hand, which the Runner is compared with: forward in
    loss mode, ``zero_grad``, backward, step (distributed_parts.py's DDP loop too)."""
    model.train()
    for batch in loader:
        loss = model(**batch, mode="loss")["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def bare_loop(epochs: int, clock: EpochClock) -> None:
    torch.manual_seed(0)
    model = BenchMLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(BenchBatches(), batch_size=None, shuffle=True, collate_fn=identity,
                        generator=torch.Generator().manual_seed(0))
    for _ in range(epochs):
        clock.epoch_start()
        epoch_by_hand(model, opt, loader)
        clock.epoch_end()


def runner_loop(epochs: int, clock: EpochClock, work_dir: str) -> None:
    runner = Runner(
        model=dict(type="BenchMLP"), work_dir=work_dir,
        train_dataloader=dict(dataset=dict(type="BenchBatches"), batch_size=None,
                              collate_fn=identity),
        train_cfg=dict(by_epoch=True, max_epochs=epochs),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        default_hooks=dict(logger=dict(type="LoggerHook", interval=10), checkpoint=None),
        custom_hooks=[EpochClockHook(clock), EpochClockEndHook(clock)],
        randomness=dict(seed=0), log_level="WARNING")
    runner.train()


SAMPLES, USER_BATCH, USER_FEATURES = 1024, 16, 32


@DATASETS.register_module(force=True)
class BenchSamples(Dataset):
    """1024 per-sample dicts ``{'inputs': [32], 'targets': [1]}`` — what a user's dataset returns."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(SAMPLES, USER_FEATURES, generator=g)
        self.items = [{"inputs": x[i], "targets": x[i, :1].clone()} for i in range(SAMPLES)]

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict:
        return self.items[i]


@MODELS.register_module(force=True)
class BenchRegressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(USER_FEATURES, 32), nn.Linear(32, 1)

    def forward(self, inputs, targets=None, mode="predict"):
        out = self.fc2(F.relu(self.fc1(inputs)))
        if mode == "loss":
            return {"loss": F.mse_loss(out, targets)}
        return out


USER_ITERS = SAMPLES // USER_BATCH


class BareUserLoop:
    """The bare loop, one epoch per call, with its own model, optimizer and loader."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = BenchRegressor()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.loader = DataLoader(BenchSamples(), batch_size=USER_BATCH)

    def epoch(self) -> float:
        """Process CPU seconds per iteration of one epoch."""
        start = time.process_time()
        epoch_by_hand(self.model, self.opt, self.loader)
        return (time.process_time() - start) / USER_ITERS


class PairedEpochs(Hook):
    """Before each Runner epoch, one bare epoch in the same process; then the Runner epoch is
    timed from here (HIGHEST, so the other hooks' before_train_epoch counts as the Runner's) to
    :class:`PairedEpochsEnd` (LOWEST). Each pair runs back to back on the same machine state, so
    their difference is free of the drift between runs that these shared machines show."""

    priority = "HIGHEST"

    def __init__(self, bare: BareUserLoop) -> None:
        self.bare, self.pairs, self._start = bare, [], 0.0

    def before_train_epoch(self, runner) -> None:
        self._bare = self.bare.epoch()
        self._start = time.process_time()

    def end(self) -> None:
        ours = (time.process_time() - self._start) / USER_ITERS
        self.pairs.append((self._bare, ours))


class PairedEpochsEnd(Hook):
    priority = "LOWEST"

    def __init__(self, paired: PairedEpochs) -> None:
        self.paired = paired

    def after_train_epoch(self, runner) -> None:
        self.paired.end()


def paired_user_run(epochs: int, work_dir: str, log_level: str = "INFO",
                    default_hooks: dict | None = None) -> list[tuple[float, float]]:
    """One Runner run of ``epochs`` epochs, each preceded by a bare epoch; the pairs after the
    first (warm-up) epoch. At INFO the training lines go where ``drun train > out.log`` sends
    them: stdout redirected to a file (and ``work_dir/logs/run.log``). ``default_hooks``: the
    config key (default: the defaults with checkpoints off; overhead_parts.py varies it)."""
    paired = PairedEpochs(BareUserLoop())
    with open(f"{work_dir}.stdout", "w") as out, contextlib.redirect_stdout(out):
        Runner(model=dict(type="BenchRegressor"), work_dir=work_dir,
               train_dataloader=dict(dataset=dict(type="BenchSamples"), batch_size=USER_BATCH,
                                     sampler=dict(type="DefaultSampler", shuffle=False)),
               train_cfg=dict(by_epoch=True, max_epochs=epochs),
               optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
               # the other five defaults, logger every 10
               default_hooks=dict(checkpoint=None) if default_hooks is None else default_hooks,
               custom_hooks=[paired, PairedEpochsEnd(paired)],
               randomness=dict(seed=0), log_level=log_level).train()
    return paired.pairs[1:]


def hook_cost(work_dir: str, iters: int = 10_000) -> float:
    """Microseconds per iteration in the default hooks' before/after_train_iter, no model."""
    runner = Runner(
        model=dict(type="BenchMLP"), work_dir=f"{work_dir}/hooks_only",
        train_dataloader=dict(dataset=dict(type="BenchBatches"), batch_size=None,
                              collate_fn=identity),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01)),
        # nothing but hooks runs here: their share of the time is 100 %, by construction
        default_hooks=dict(logger=dict(type="LoggerHook", interval=10, hook_time_warn_share=1.0),
                           checkpoint=None),
        randomness=dict(seed=0), log_level="WARNING")
    outputs = {"loss": torch.tensor(0.5)}
    call, loop = runner.call_hook, runner.train_loop
    call("before_run")
    call("before_train")
    call("before_train_epoch")
    best = float("inf")
    for _ in range(5):
        loop.state.iter = 0
        start = time.process_time()
        for i in range(iters):
            call("before_train_iter", batch_idx=i, data_batch=None)
            call("after_train_iter", batch_idx=i, data_batch=None, outputs=outputs)
            loop.state.iter += 1
        best = min(best, time.process_time() - start)
    call("after_run")
    return best / iters * 1e6


def report(title: str, bare: EpochClock, ours: EpochClock) -> None:
    print(title)
    for label, k in (("cpu ", 1), ("wall", 0)):
        b, o = [x[k] for x in bare.samples], [x[k] for x in ours.samples]
        for name, stat in (("median", statistics.median), ("min", min)):
            print(f"[{label}] {name:6s} bare loop {stat(b) * 1e6:6.1f} us/iter | Runner "
                  f"{stat(o) * 1e6:6.1f} us/iter | overhead {(stat(o) - stat(b)) * 1e6:5.1f} "
                  f"us/iter | ratio {stat(o) / stat(b):.3f}")


def spread(diffs: list[float]) -> tuple[float, float, float]:
    """The median and the lower and upper quartiles of pair differences."""
    d = sorted(diffs)
    return statistics.median(d), d[len(d) // 4], d[(3 * len(d)) // 4]


def user_path(rounds: int, epochs: int, log_level: str = "INFO") -> None:
    """The headline case (module docstring): per-pair differences of process CPU time."""
    pairs: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            pairs += paired_user_run(epochs, f"{tmp}/run{r}", log_level)
    median, q1, q3 = spread([ours - bare for bare, ours in pairs])
    bare = statistics.median(b for b, _ in pairs)
    ours = statistics.median(o for _, o in pairs)
    print(f"user path: per-sample dict dataset, DefaultSampler + collate, 7 default hooks "
          f"(checkpoint off, logger every 10 at {log_level}), MLP 32-32-1, batch {USER_BATCH}, "
          f"{USER_ITERS} iters/epoch; {len(pairs)} pairs of back-to-back epochs (bare, Runner), "
          f"process CPU time; target overhead <= 15 us/iter")
    print(f"bare loop {bare * 1e6:6.1f} us/iter | Runner {ours * 1e6:6.1f} us/iter | overhead: "
          f"median of pair differences {median * 1e6:5.1f} us/iter "
          f"(quartiles {q1 * 1e6:.1f} .. {q3 * 1e6:.1f}) | ratio {ours / bare:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--user-rounds", type=int, default=6)
    parser.add_argument("--only-user-path", action="store_true")
    parser.add_argument("--log-level", default="INFO",
                        help="the user path's log_level (INFO: lines to a file, as "
                             "'drun train > out.log' writes them)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    user_path(args.user_rounds, args.epochs, args.log_level)
    if args.only_user_path:
        return
    bare, ours = EpochClock(), EpochClock()
    with tempfile.TemporaryDirectory() as tmp:
        bare_loop(2, EpochClock()), runner_loop(2, EpochClock(), f"{tmp}/warm")  # warm-up
        for r in range(args.repeats):
            runs = [lambda: bare_loop(args.epochs, bare),
                    lambda: runner_loop(args.epochs, ours, f"{tmp}/run{r}")]
            for run in (runs if r % 2 == 0 else runs[::-1]):
                bare._epoch = ours._epoch = 0
                run()
        hooks_only = hook_cost(tmp)
    report("pre-batched: 16 ready-made batches an epoch (collation out of the picture)", bare, ours)
    print(f"default hooks alone, through dispatch: {hooks_only:5.1f} us/iter "
          f"(before/after_train_iter incl. timing and a log record every 10; best of 5)")
    print("target: <= 15 us/iter (MMEngine's Runner adds 390-540 us here, logging every 10)")
    print_dispatch_costs()

if __name__ == "__main__":
    main()
