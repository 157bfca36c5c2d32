"""Activation checkpointing: the memory it saves and the time it costs, one process, the Runner.

A GPT-2-architecture transformer trains with ``strategy=dict(type='ddp')`` and with
``strategy=dict(type='ddp', activation_checkpointing=[<its block class>])``, alternately (without,
with, without, ...), on the same per-sample synthetic tokens. Printed for each: the step time
(the mean over the timed iterations, the median over the runs), the bytes saved for backward,
and on CUDA the peak memory; then the ratios with/without.

* **Saved for backward** (any device): the bytes of the distinct tensors autograd keeps from one
  forward for its backward, counted with ``torch.autograd.graph.saved_tensors_hooks`` around a
  warm-up iteration's forward (:class:`SavedBytes`; each storage once, the parameters left out,
  which are held anyway). What activation checkpointing frees is exactly this: a recomputed
  block keeps its inputs, not what it computed inside. It leaves out what backward allocates
  (gradients, and with checkpointing one block's activations recomputed at a time).
* **Peak memory** (CUDA): ``torch.cuda.max_memory_allocated`` over the timed iterations:
  weights, gradients, AdamW's state, activations and the recomputation together.

Models (``--model``): ``gpt``, benchmarks/gpu_models.py's ``GPT`` (block class ``Block``), or
``hf-gpt2``, ``transformers.GPT2LMHeadModel`` built from a ``GPT2Config`` through dotted
``type=`` paths (block class ``GPT2Block``; no dropout, no key/value cache, as ``gpu_throughput``
builds it). Sizes (``--size``): ``small`` is GPT-2 small (124 M parameters, 1024 tokens, batch
8; the default on CUDA, under bf16 autocast as ``gpu_throughput.py`` trains it); ``example``
the language-model example's (configs/gpt_bytes.py: width 192, 4 layers, 6 heads, 128 tokens,
vocabulary 256, batch 32; fp32, the default on a CPU); ``--smoke`` the tiny ToyGPT size and
1+2 iterations, a check that it runs.
Needs torch (and transformers for ``hf-gpt2``) only: no ray, no mlflow.

    python benchmarks/activation_checkpointing.py [--model gpt|hf-gpt2] [--size small|example]
        [--iters 10] [--warmup 3] [--repeats 3] [--smoke]
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_models import GPT, SyntheticTokens
from benchmarks.gpu_throughput import SyntheticIds, hf_gpt2_config
from distributed_runner import Runner
from hooks import Hook

SIZES = {"smoke": dict(vocab=64, context=16, width=32, layers=2, heads=2, batch=2),
         "example": dict(vocab=256, context=128, width=192, layers=4, heads=6, batch=32),
         "small": dict(vocab=50257, context=1024, width=768, layers=12, heads=12, batch=8)}
BLOCKS = {"gpt": "Block", "hf-gpt2": "GPT2Block"}


class SavedBytes:
    """Bytes of the distinct storages autograd saves for backward while it is entered (the
    parameters' excluded). A saved tensor stays alive until backward, so no storage counted
    here can be freed and its address reused within one forward: counting by address is exact.
    """

    def __init__(self, model: nn.Module) -> None:
        self.skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.skip:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    @property
    def total(self) -> int:
        return sum(self.storages.values())

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Probe(Hook):
    """Counts the saved bytes in iteration ``warmup - 1`` (untimed) and times the iterations
    after the warm-up; on CUDA, the peak memory over them."""

    priority = "HIGHEST"

    def __init__(self, warmup: int, device: torch.device) -> None:
        self.warmup, self.device = warmup, device
        self.calls, self.start, self.seconds = 0, 0.0, 0.0
        self.saved: SavedBytes | None = None
        self.peak = 0

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self.calls == self.warmup - 1:
            self.saved = SavedBytes(runner.model).__enter__()
        if self.calls == self.warmup:
            synchronize(self.device)
            if self.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(self.device)
            self.start = time.perf_counter()
        self.calls += 1

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if self.calls == self.warmup and self.saved is not None:
            self.saved.__exit__(None, None, None)

    def after_train(self, runner) -> None:
        synchronize(self.device)
        self.seconds = time.perf_counter() - self.start
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)


@dataclass
class Setup:
    model: str
    size: dict
    device: torch.device
    warmup: int
    iters: int


def model_and_data(s: Setup) -> tuple[Any, Any]:
    """The model (a module, or for ``hf-gpt2`` its dotted-path config) and the dataset."""
    z = s.size
    if s.model == "hf-gpt2":
        config = hf_gpt2_config(z["vocab"], z["context"], z["width"], z["layers"], z["heads"])
        model = dict(type="transformers.GPT2LMHeadModel", config=config)
        return model, SyntheticIds(z["batch"] * 8, z["context"], z["vocab"], s.device)
    torch.manual_seed(0)
    model = GPT(z["vocab"], z["context"], z["width"], z["layers"], z["heads"])
    return model, SyntheticTokens(z["batch"] * 8, z["context"], z["vocab"], s.device)


def train(s: Setup, recompute: list[str], work_dir: str) -> Probe:
    """One Runner run (its default hooks, the logger quiet, checkpoints off); its Probe."""
    model, data = model_and_data(s)
    probe = Probe(s.warmup, s.device)
    optim: dict = dict(optimizer=dict(type="AdamW", lr=3e-4, weight_decay=0.1))
    if s.device.type == "cuda":
        optim.update(type="AmpOptimWrapper", dtype="bfloat16")
    Runner(model=model, work_dir=work_dir, device=str(s.device),
           train_dataloader=dict(dataset=data, batch_size=s.size["batch"], drop_last=True,
                                 sampler=dict(type="DefaultSampler", shuffle=False)),
           train_cfg=dict(by_epoch=False, max_iters=s.warmup + s.iters),
           optim_wrapper=optim, strategy=dict(type="ddp", activation_checkpointing=recompute),
           default_hooks=dict(checkpoint=None, logger=dict(type="LoggerHook", interval=1000)),
           custom_hooks=[probe], randomness=dict(seed=0), log_level="WARNING").train()
    gc.collect()
    if s.device.type == "cuda":
        torch.cuda.empty_cache()
    return probe


def mb(n: float) -> str:
    """Bytes in MiB (KiB below one), as people read memory figures."""
    return f"{n / 2**20:,.1f} MB" if n >= 2**20 else f"{n / 2**10:,.1f} KB"


def report(name: str, probes: list[Probe], s: Setup) -> tuple[float, float, float]:
    """One line for a configuration; (step seconds, saved bytes, peak bytes), medians."""
    step = statistics.median(p.seconds / s.iters for p in probes)
    saved = statistics.median(p.saved.total for p in probes if p.saved is not None)
    peak = statistics.median(p.peak for p in probes)
    runs = ", ".join(f"{p.seconds / s.iters * 1e3:.1f}" for p in probes)
    line = (f"{name}: saved for backward {mb(saved)} | step {step * 1e3:,.1f} ms "
            f"(runs: {runs})")
    line += f" | peak memory {mb(peak)}" if s.device.type == "cuda" else " | peak n/a (CPU)"
    print(line, flush=True)
    return step, saved, peak


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(BLOCKS), default="gpt")
    parser.add_argument("--size", choices=("small", "example"), default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny, 1+2 iterations, one run")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size = "smoke" if args.smoke else args.size or ("small" if device.type == "cuda" else "example")
    if args.smoke:
        args.warmup, args.iters, args.repeats = 1, 2, 1
    s = Setup(args.model, SIZES[size], device, max(args.warmup, 1), args.iters)
    z, block = s.size, BLOCKS[args.model]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    precision = "bf16 autocast" if device.type == "cuda" else "fp32"
    print(f"activation checkpointing: {name} | torch {torch.__version__} | {args.model} "
          f"width {z['width']}, {z['layers']} layers, {z['heads']} heads, vocabulary "
          f"{z['vocab']}, batch {z['batch']} x {z['context']} tokens, AdamW, {precision} | "
          f"Runner, one process | {s.warmup} warm-up + {s.iters} timed iterations, "
          f"{args.repeats} alternating runs, medians", flush=True)
    runs: dict[str, list[Probe]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for key, recompute in (("without", []), ("with", [block])):
                runs[key].append(train(s, recompute, f"{tmp}/{key}{r}"))
    off = report("without", runs["without"], s)
    on = report(f"with activation_checkpointing=['{block}']", runs["with"], s)
    peak = f"{on[2] / off[2]:.3f}" if device.type == "cuda" else "n/a"
    print(f"with/without: saved for backward {on[1] / off[1]:.3f} | step time "
          f"{on[0] / off[0]:.3f} | peak memory {peak}", flush=True)


if __name__ == "__main__":
    main()
