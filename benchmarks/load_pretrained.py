"""Host memory per rank while a Runner loads a Hugging Face model under FSDP: ``load_from=<a
save_pretrained directory>`` (the model built on the meta device, sharded, each rank reading only
its slices) against every rank calling ``AutoModelForCausalLM.from_pretrained`` and then sharding.

Why: loading is where FSDP on many ranks runs out of host memory — 8 ranks of a machine each
holding an 8B model before sharding is 8 copies. With ``load_from`` no rank should ever hold more
than about its share of the model (model size / world size).

A Llama of ``--hidden``/``--layers`` (``tools/make_tiny_llama.py``: float32, safetensors shards of
100 MB; kept in ``--model-dir`` when given, else in a temporary folder) is loaded by 2 local gloo
processes (one thread each) with
``strategy=dict(type='fsdp', shard_modules=['LlamaDecoderLayer'])``, once by each path, each path
in fresh processes. Each rank measures, while ``Runner.from_cfg`` runs, over its resident memory
before (after the imports both paths need):

* peak: the kernel's high-water mark ``VmHWM`` (reset through ``/proc/self/clear_refs`` just
  before). It counts mapped file pages too — the safetensors files, memory-mapped by both paths,
  which are page cache shared by the ranks and reclaimable, and some 10 MB of library code that
  building a Runner first touches (most of ``--smoke``'s figure).
* private peak: ``RssAnon`` (memory no other process or file holds), read every 2 ms by a thread
  (the kernel keeps no peak of it: a lower bound).

Both are printed in MB and as a ratio to (model size / world size): 1 is each rank holding its
share and nothing more. Both paths must end with the same local shards (every parameter's sum, per
rank, compared). With the files' dtype, ``from_pretrained`` (transformers 5) leaves the weights as
views of the memory-mapped files, so sharding copies only each rank's slices and its private peak
is about its share as well; ``--dtype bfloat16`` (both models built in bfloat16 from the float32
files) is the case where it converts, and so holds, the whole model on every rank.

    python benchmarks/load_pretrained.py [--hidden 1024] [--layers 8] [--heads 16]
                                         [--dtype bfloat16] [--model-dir DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import importlib
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.ranks import leave_rank_process  # noqa: E402

WORLD = 2
PATHS = ("load_from", "from_pretrained")  # the meta-device path, the naive one
# what either path imports on the way, imported before the first measurement
PRELOADED = (
    "safetensors.torch",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.hf_storage",
    "torch.distributed.fsdp",
    "transformers.models.llama.modeling_llama",
)


def model_spec(path: str, model_dir: str, dtype: str | None) -> dict:
    """The model of each path's config: built from the config (then filled by ``load_from``),
    or ``from_pretrained`` on every rank; in ``dtype`` when given (else the files' dtype)."""
    extra = {} if dtype is None else {"dtype": dtype}
    if path == "load_from":
        config = {
            "type": "transformers.AutoConfig.from_pretrained",
            "pretrained_model_name_or_path": model_dir,
        }
        return {"type": "transformers.AutoModelForCausalLM.from_config", "config": config, **extra}
    return {
        "type": "transformers.AutoModelForCausalLM.from_pretrained",
        "pretrained_model_name_or_path": model_dir,
        **extra,
    }


def memory_kb() -> dict[str, int]:
    """This process's ``VmRSS``, ``VmHWM`` (its peak since the last reset) and ``RssAnon``
    (private memory: ``VmRSS`` less mapped files and shared memory), in kB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon"):
            fields[key] = int(value.split()[0])
    return fields


def reset_peak() -> None:
    """Make ``VmHWM`` start again from the current ``VmRSS`` (Linux: ``clear_refs`` 5)."""
    Path("/proc/self/clear_refs").write_text("5")


class PrivatePeak:
    """The highest ``RssAnon`` seen while inside, read every ``every`` seconds by a thread (the
    kernel keeps no high-water mark of it, so this is a lower bound)."""

    def __init__(self, every: float = 0.002) -> None:
        self.every = every
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while True:
            self.peak_kb = max(self.peak_kb, memory_kb()["RssAnon"])
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> PrivatePeak:
        self.peak_kb = memory_kb()["RssAnon"]
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_kb = max(self.peak_kb, memory_kb()["RssAnon"])


def _local(t: torch.Tensor) -> torch.Tensor:
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _worker(rank: int, port: int, path: str, model_dir: str, dtype: str | None, out: str) -> None:
    faulthandler.dump_traceback_later(600, exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    try:
        from transformers.utils import logging as transformers_logging

        from distributed_runner import Runner

        for module in PRELOADED:
            importlib.import_module(module)
        transformers_logging.disable_progress_bar()  # from_pretrained's "Loading weights" bar
        cfg = {
            "work_dir": f"{out}/{path}",
            "run_name": ".",
            "log_level": "WARNING",
            "model": model_spec(path, model_dir, dtype),
            "strategy": {"type": "fsdp", "shard_modules": ["LlamaDecoderLayer"]},
        }
        if path == "load_from":
            cfg["load_from"] = model_dir
        gc.collect()
        torch.distributed.barrier()
        before = memory_kb()
        reset_peak()
        with PrivatePeak() as private:
            start = time.perf_counter()
            runner = Runner.from_cfg(cfg)
            seconds = time.perf_counter() - start
        after = memory_kb()
        with torch.no_grad():
            sums = {
                name: _local(p).double().sum().item() for name, p in runner.model.named_parameters()
            }
        result = {
            "peak_kb": after["VmHWM"] - before["VmRSS"],
            "private_kb": private.peak_kb - before["RssAnon"],
            "held_kb": after["VmRSS"] - before["VmRSS"],
            "seconds": seconds,
            "sums": sums,
        }
        Path(out, f"{path}_{rank}.json").write_text(json.dumps(result))
    except BaseException:  # noqa: BLE001 - any failure: end this rank now (see below)
        import traceback

        traceback.print_exc()  # and exit at once: mp.spawn then ends the other rank, which
        os._exit(1)  # would otherwise wait forever in a collective
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    leave_rank_process()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_model(model_dir: Path, hidden: int, layers: int, heads: int) -> None:
    """``tools/make_tiny_llama.py`` into ``model_dir`` unless a model is there already."""
    if (model_dir / "config.json").is_file():
        return
    options = f"--hidden {hidden} --layers {layers} --heads {heads} --max-shard-size 100MB"
    tool = ROOT / "tools" / "make_tiny_llama.py"
    made = subprocess.run(
        [sys.executable, str(tool), str(model_dir), *options.split()],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if made.returncode:
        raise SystemExit(f"{tool.name} failed:\n{made.stderr[-2000:]}")


def model_bytes(model_dir: Path, dtype: str | None) -> tuple[int, int]:
    """(the weights' bytes in the files, the model's bytes in ``dtype``), from the headers."""
    from distributed_runner.checkpoint.hf.directory import tensor_index
    from distributed_runner.checkpoint.hf.load import checkpoint_bytes

    files = checkpoint_bytes(model_dir)
    if dtype is None:
        return files, files
    numel = sum(math.prod(info.shape) for info in tensor_index(model_dir).values())
    return files, numel * torch.empty((), dtype=getattr(torch, dtype)).element_size()


def run(model_dir: Path, dtype: str | None, work: str) -> dict[str, list[dict]]:
    """Per path, each rank's result; each path in 2 fresh processes."""
    results = {}
    for path in PATHS:
        mp.spawn(
            _worker, args=(free_port(), path, str(model_dir), dtype, work), nprocs=WORLD, join=True
        )
        results[path] = [
            json.loads(Path(work, f"{path}_{r}.json").read_text()) for r in range(WORLD)
        ]
    return results


def differing_shards(results: dict[str, list[dict]]) -> list[str]:
    """``rank R name`` for every parameter whose local shard differs between the paths."""
    differ = []
    for rank in range(WORLD):
        ours, theirs = (results[path][rank]["sums"] for path in PATHS)
        differ += [
            f"rank {rank} {n}"
            for n in sorted(ours.keys() | theirs.keys())
            if ours.get(n) != theirs.get(n)
        ]
    return differ


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],
        help="build the model in this dtype (both paths; default: the files', float32)",
    )
    parser.add_argument("--model-dir", help="the model's folder: reused when it holds one")
    parser.add_argument("--smoke", action="store_true", help="a tiny model (hidden 64, 2 layers)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.hidden, args.layers, args.heads = 64, 2, 4
    with tempfile.TemporaryDirectory(dir=os.environ.get("DRUN_BENCH_DIR")) as work:
        model_dir = Path(args.model_dir or f"{work}/model").expanduser()
        ensure_model(model_dir, args.hidden, args.layers, args.heads)
        files, size = model_bytes(model_dir, args.dtype)
        config = json.loads((model_dir / "config.json").read_text())
        results = run(model_dir, args.dtype, work)
    share = size / WORLD
    built = args.dtype or "the files' dtype"
    print(
        f"load pretrained: Llama hidden {config['hidden_size']}, {config['num_hidden_layers']} "
        f"layers, {files / 1e6:.1f} MB of weights in the files, model {size / 1e6:.1f} MB in "
        f"{built}, {WORLD} gloo processes, FSDP over LlamaDecoderLayer: size/world "
        f"{share / 1e6:.1f} MB"
    )
    print(
        f"{'path':15} | rank | peak MB during build | ratio to size/world | build s "
        f"| private peak MB | ratio | held after MB"
    )
    worst: dict[str, list[float]] = {path: [0.0, 0.0] for path in PATHS}
    for path in PATHS:
        for rank, r in enumerate(results[path]):
            peak, private = r["peak_kb"] * 1024, r["private_kb"] * 1024
            worst[path] = [max(worst[path][0], peak / share), max(worst[path][1], private / share)]
            print(
                f"{path:15} | {rank:4} | {peak / 1e6:20.1f} | {peak / share:19.2f} "
                f"| {r['seconds']:7.2f} | {private / 1e6:15.1f} | {private / share:5.2f} "
                f"| {r['held_kb'] * 1024 / 1e6:13.1f}"
            )
    differ = differing_shards(results)
    same = (
        "the same local shards on every rank"
        if not differ
        else f"DIFFERENT local shards: {', '.join(differ[:3])}"
    )
    (meta, meta_private), (naive, naive_private) = worst["load_from"], worst["from_pretrained"]
    print(
        f"worst ratio to size/world: load_from {meta:.2f}, from_pretrained {naive:.2f} "
        f"(load_from/from_pretrained {meta / naive:.2f}; private memory {meta_private:.2f} "
        f"against {naive_private:.2f}); {same}"
    )
    if differ:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
