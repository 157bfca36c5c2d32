"""Training throughput on a GPU: a raw PyTorch loop against the Runner, same model and data.

Two workloads: ResNet-50 on synthetic 224x224 images (batch 128) and a GPT-2-small-sized
transformer on synthetic 1024-token sequences (batch 8), both under bf16 autocast. A third,
``hf-gpt2`` (not run by default), is the same GPT-2-small size and data as Hugging Face's
``transformers.GPT2LMHeadModel(GPT2Config(...))``, dropout and the key/value cache off as in
``gpt2``: the raw loop calls ``model(input_ids=..., labels=...).loss``, the Runner builds it from
``model=dict(type='transformers.GPT2LMHeadModel', config=dict(type='transformers.GPT2Config',
...))`` and calls it as it is (no ``mode``). The data is
a per-sample dataset held on the GPU, so both loops run the per-sample path (sampler, collate)
a user's dataset runs, without timing a host-to-device input pipeline, which is the user's and
not ours. The raw loop is the loop people write: ``DataLoader(dataset, batch_size)``, forward
under autocast, backward, ``step``, ``zero_grad``, and ``loss.item()`` printed every 10
iterations. The Runner runs with its default hooks (logger every 10 at INFO with stdout sent to
a file, checkpoints off) and ``AmpOptimWrapper(dtype='bfloat16')``. Runs alternate (raw,
Runner, raw, ...); each is timed between two ``cuda.synchronize()`` calls after its warm-up.

Printed per workload: items/s of both, their ratio (target: Runner >= 0.99x raw), MFU (FLOPs of
one training step counted by ``torch.utils.flop_counter`` over the device's dense bf16 peak),
and the host-device synchronisations per iteration, counted with
``torch.cuda.set_sync_debug_mode('warn')`` in a separate short run (aim: none outside logging
iterations). ``--modes eager,compiled`` adds the same comparison with ``torch.compile``
(``compile=True`` for the Runner).

    python benchmarks/gpu_throughput.py [--models resnet50,gpt2,hf-gpt2] [--modes eager,compiled]
        [--iters 60] [--repeats 3] [--peak-tflops 989] [--smoke]

``--smoke`` runs reduced sizes (CPU in CI): it checks that the benchmark runs, not a figure.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_models import GPT, ResNet, SyntheticImages, SyntheticTokens
from distributed_runner import Runner
from hooks import Hook

LOG_EVERY = 10
# dense bf16 peak of the GPUs this is run on (no sparsity), TFLOP/s
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.1, "L4": 121.0}


def mode_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """The loss of a model written the Runner's way (``forward(..., mode='loss')``)."""
    return model(**batch, mode="loss")["loss"]


def output_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """The loss of a Hugging Face model (``labels`` in the batch, ``.loss`` in its output)."""
    return model(**batch).loss


@dataclass
class Workload:
    name: str
    unit: str
    batch: int
    items_per_iter: int
    describe: str
    make_model: Callable[[], nn.Module]
    make_data: Callable[[torch.device], Dataset]
    optimizer: dict
    loss: Callable[[nn.Module, dict], torch.Tensor] = mode_loss
    runner_model: Any = None  # what the Runner builds (a config); None: make_model's module


class SyntheticIds(Dataset):
    """``n`` per-sample ``{'input_ids': [context], 'labels': [context]}`` held on ``device``
    (a Hugging Face causal LM shifts the labels itself)."""

    def __init__(self, n: int, context: int, vocab: int, device: torch.device) -> None:
        self.tokens = SyntheticTokens(n, context - 1, vocab, device).tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def hf_gpt2_config(vocab: int, context: int, width: int, layers: int, heads: int) -> dict:
    """``GPT2Config`` at ``gpt2``'s shape, as a dotted-path config: no dropout (``GPT`` has
    none), no key/value cache (training does not read one), the end-of-text token the last of
    the vocabulary (50256 at GPT-2's)."""
    return dict(type="transformers.GPT2Config", vocab_size=vocab, n_positions=context,
                n_embd=width, n_layer=layers, n_head=heads, resid_pdrop=0.0, embd_pdrop=0.0,
                attn_pdrop=0.0, use_cache=False, bos_token_id=vocab - 1, eos_token_id=vocab - 1)


def hf_gpt2(config: dict) -> nn.Module:
    import transformers
    args = {k: v for k, v in config.items() if k != "type"}
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**args))


def gpt2_shape(smoke: bool) -> tuple[int, dict]:
    """(batch, GPT shape) of the ``gpt2`` and ``hf-gpt2`` workloads."""
    return (2, dict(vocab=128, context=32, width=32, layers=2, heads=2)) if smoke \
        else (8, dict(vocab=50257, context=1024, width=768, layers=12, heads=12))


def workload(name: str, smoke: bool) -> Workload:
    if name == "resnet50":
        batch, size, classes = (4, 32, 10) if smoke else (128, 224, 1000)
        shape = dict(base=8, blocks=(1, 1, 1, 1)) if smoke else {}
        return Workload(name, "images", batch, batch, f"batch {batch}, {size}x{size}",
                        lambda: ResNet(classes, **shape),
                        lambda d: SyntheticImages(batch * 8, size, classes, d),
                        dict(type="SGD", lr=0.01, momentum=0.9, weight_decay=1e-4))
    if name == "hf-gpt2":
        batch, shape = gpt2_shape(smoke)
        config = hf_gpt2_config(**shape)
        return Workload(name, "tokens", batch, batch * shape["context"],
                        f"batch {batch} x {shape['context']} tokens", lambda: hf_gpt2(config),
                        lambda d: SyntheticIds(batch * 8, shape["context"], shape["vocab"], d),
                        dict(type="AdamW", lr=3e-4, weight_decay=0.1), output_loss,
                        dict(type="transformers.GPT2LMHeadModel", config=config))
    if name == "gpt2":
        batch, shape = gpt2_shape(smoke)
        return Workload(name, "tokens", batch, batch * shape["context"],
                        f"batch {batch} x {shape['context']} tokens",
                        lambda: GPT(**shape),
                        lambda d: SyntheticTokens(batch * 8, shape["context"], shape["vocab"], d),
                        dict(type="AdamW", lr=3e-4, weight_decay=0.1))
    raise SystemExit(f"--models: unknown model {name!r}; choose from resnet50, gpt2, hf-gpt2")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fresh_model(w: Workload, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return w.make_model().to(device)


def endless(loader: DataLoader):
    while True:
        yield from loader


def raw_loop(w: Workload, data: Dataset, device: torch.device, warmup: int, iters: int,
             compiled: bool, log, on_iter: Callable[[int], None] | None = None) -> float:
    """Seconds per iteration of the loop people write by hand."""
    model = fresh_model(w, device)
    optimizer_args = dict(w.optimizer)
    optimizer = getattr(torch.optim, optimizer_args.pop("type"))(model.parameters(),
                                                                **optimizer_args)
    call = torch.compile(model) if compiled else model
    batches = endless(DataLoader(data, batch_size=w.batch, shuffle=False, drop_last=True))
    model.train()
    start = 0.0
    for i in range(warmup + iters):
        batch = next(batches)
        if on_iter is not None:
            on_iter(i)
        if i == warmup:
            synchronize(device)
            start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = w.loss(call, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (i + 1) % LOG_EVERY == 0:
            print(f"iter {i + 1} loss {loss.item():.4f}", file=log)
    synchronize(device)
    return (time.perf_counter() - start) / iters


class IterClock(Hook):
    """First of every ``before_train_iter``: starts the clock at the first timed iteration (and
    calls ``on_iter`` with the iteration's index); :meth:`stop` ends it after training."""

    priority = "HIGHEST"

    def __init__(self, warmup: int, device: torch.device,
                 on_iter: Callable[[int], None] | None = None) -> None:
        self.warmup, self.device, self.on_iter = warmup, device, on_iter
        self.calls, self.start, self.seconds = 0, 0.0, 0.0

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self.on_iter is not None:
            self.on_iter(self.calls)
        if self.calls == self.warmup:
            synchronize(self.device)
            self.start = time.perf_counter()
        self.calls += 1


class IterClockEnd(Hook):
    priority = "LOWEST"

    def __init__(self, clock: IterClock) -> None:
        self.clock = clock

    def after_train(self, runner) -> None:
        synchronize(self.clock.device)
        self.clock.seconds = time.perf_counter() - self.clock.start


def runner_loop(w: Workload, data: Dataset, device: torch.device, warmup: int, iters: int,
                compiled: bool, work_dir: str, on_iter: Callable[[int], None] | None = None
                ) -> float:
    """Seconds per iteration of the Runner with its default hooks (checkpoints off)."""
    clock = IterClock(warmup, device, on_iter)
    with open(f"{work_dir}.stdout", "w") as out, contextlib.redirect_stdout(out):
        model = fresh_model(w, device) if w.runner_model is None \
            else copy.deepcopy(w.runner_model)
        Runner(model=model, work_dir=work_dir, device=str(device),
               train_dataloader=dict(dataset=data, batch_size=w.batch, drop_last=True,
                                     sampler=dict(type="DefaultSampler", shuffle=False)),
               train_cfg=dict(by_epoch=False, max_iters=warmup + iters),
               optim_wrapper=dict(type="AmpOptimWrapper", dtype="bfloat16",
                                  optimizer=dict(w.optimizer)),
               default_hooks=dict(checkpoint=None,
                                  logger=dict(type="LoggerHook", interval=LOG_EVERY)),
               custom_hooks=[clock, IterClockEnd(clock)], compile=compiled,
               randomness=dict(seed=0), log_level="INFO").train()
    return clock.seconds / iters


class SyncCounter:
    """Synchronising CUDA calls per iteration, from ``set_sync_debug_mode('warn')``'s warnings;
    an iteration's window runs from its ``before_train_iter`` to the next one's."""

    def __init__(self) -> None:
        self.marks: list[int] = []
        self.caught: list = []

    def mark(self, i: int) -> None:
        self.marks.append(len(self.caught))

    def per_iter(self) -> list[int]:
        ends = self.marks[1:] + [len(self.caught)]
        return [end - start for start, end in zip(self.marks, ends)]


def count_syncs(run: Callable[[Callable[[int], None]], object]) -> tuple[int, int]:
    """(most syncs in an iteration that does not log, most in one that logs)."""
    counter = SyncCounter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        counter.caught = caught
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run(counter.mark)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    counts = counter.per_iter()[1:]  # the first iteration builds caches and compiles
    logging = [c for i, c in enumerate(counts, start=1) if (i + 1) % LOG_EVERY == 0]
    quiet = [c for i, c in enumerate(counts, start=1) if (i + 1) % LOG_EVERY]
    return max(quiet, default=0), max(logging, default=0)


def step_flops(w: Workload, data: Dataset, device: torch.device) -> float:
    """FLOPs of one forward + backward at the workload's batch (matmuls and convolutions)."""
    from torch.utils.flop_counter import FlopCounterMode
    model = fresh_model(w, device)
    batch = next(iter(DataLoader(data, batch_size=w.batch)))
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = w.loss(model, batch)
        loss.backward()
    return float(counter.get_total_flops())


def peak_flops(device: torch.device, given: float | None) -> float | None:
    if given:
        return given * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tf * 1e12 for key, tf in PEAK_BF16_TFLOPS.items() if key in name), None)


def measure(w: Workload, device: torch.device, args: argparse.Namespace, compiled: bool,
            tmp: str) -> str:
    data = w.make_data(device)
    raw, ours = [], []
    with open(f"{tmp}/raw.log", "w") as log:
        for r in range(args.repeats):
            raw.append(raw_loop(w, data, device, args.warmup, args.iters, compiled, log))
            ours.append(runner_loop(w, data, device, args.warmup, args.iters, compiled,
                                    f"{tmp}/{w.name}_{compiled}_{r}"))
    raw_s, ours_s = statistics.median(raw), statistics.median(ours)
    pairs = ", ".join(f"{a / b:.3f}" for a, b in zip(raw, ours))
    line = (f"{w.name} ({w.describe}) {'compiled' if compiled else 'eager'}: raw "
            f"{w.items_per_iter / raw_s:,.1f} {w.unit}/s | Runner {w.items_per_iter / ours_s:,.1f}"
            f" {w.unit}/s | ratio {raw_s / ours_s:.3f} (runs: {pairs}) | "
            f"ms/iter raw {', '.join(f'{t * 1e3:.2f}' for t in raw)}, Runner "
            f"{', '.join(f'{t * 1e3:.2f}' for t in ours)}")
    peak = peak_flops(device, args.peak_tflops)
    if peak:
        flops = step_flops(w, data, device)
        line += f" | MFU raw {flops / raw_s / peak:.1%} Runner {flops / ours_s / peak:.1%}"
    if device.type == "cuda":
        n = 2 * LOG_EVERY + 2
        with open(f"{tmp}/sync.log", "w") as log:
            raw_syncs = count_syncs(lambda mark: raw_loop(w, data, device, 1, n, compiled, log,
                                                          on_iter=mark))
        ours_syncs = count_syncs(lambda mark: runner_loop(w, data, device, 1, n, compiled,
                                                          f"{tmp}/sync", on_iter=mark))
        line += (f" | syncs/iter outside logging: Runner {ours_syncs[0]}, raw {raw_syncs[0]};"
                 f" in logging iterations: Runner {ours_syncs[1]}, raw {raw_syncs[1]}")
    else:
        line += " | syncs/iter: n/a (no CUDA)"
    return line


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,gpt2")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="eager", help="eager, compiled or both")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's dense bf16 peak, for MFU (known GPUs are looked up)")
    parser.add_argument("--smoke", action="store_true", help="reduced sizes, a CPU check")
    args = parser.parse_args(argv)
    if args.smoke:
        args.warmup, args.iters, args.repeats = 2, LOG_EVERY + 2, 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"gpu throughput: {name} | torch {torch.__version__} | bf16 autocast | per-sample "
          f"synthetic data on the device | Runner: default hooks, logger every {LOG_EVERY}, "
          f"checkpoints off | {args.warmup} warm-up + {args.iters} timed iterations, "
          f"{args.repeats} alternating runs each, medians", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            w = workload(model.strip(), args.smoke)
            for mode in args.modes.split(","):
                if mode.strip() not in ("eager", "compiled"):
                    raise SystemExit(f"--modes: unknown mode {mode!r}; eager or compiled")
                compiled = mode.strip() == "compiled"
                print(measure(w, device, args, compiled, tmp), flush=True)


if __name__ == "__main__":
    main()
