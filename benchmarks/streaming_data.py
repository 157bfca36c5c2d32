"""Streamed training data: StreamingLoader against Ray Data and Mosaic ``streaming`` on the same
Parquet rows, side by side in one run.

    python benchmarks/streaming_data.py [--rows 1000000] [--memory-rows 1000000,4000000]
        [--mosaic-python PATH] [--skip-ray-data] [--work-dir DIR]
        [--startup-files 1000,10000,100000] [--latency-ms 5]

Data (written once under ``--work-dir``): ``features`` — ``inputs`` (16 float32, a fixed-size
list) and ``labels`` (int64), files of 100k rows in row groups of 10k — and ``tokens`` — rows of
128 byte-valued int64 token ids (``input_ids``, as ``tools/make_byte_corpus.py`` writes them),
1/8 as many rows.

Each figure comes from a fresh process (peak memory: the process's peak resident set plus its
largest child's, so a forked worker's shared pages count twice, alike for all three):

* **samples/s** over one epoch with one loader worker (``num_workers=1``): StreamingLoader
  (shuffled, the default), Mosaic ``StreamingDataset`` (shuffled, its default algorithm) through a
  DataLoader with one worker, Ray Data ``read_parquet(...).iter_torch_batches`` (its own read
  tasks, on a local Ray of 2 CPUs: not one worker; Ray's object store memory is not in the RSS);
* **first batch after a resume** at 0 %, 50 % and 90 % of the epoch: StreamingLoader's
  ``resume_at``, Mosaic's ``StreamingDataLoader.load_state_dict``, and for Ray Data what
  ``RayDataLoader`` does (iterate over the consumed batches);
* **peak memory** of the reader at ``--memory-rows`` rows (flat in the data size is the goal).

**Startup at scale** (``--startup-files``; ``0`` leaves it out): one rank of 8 starting over
``N`` files of one row group each, on a filesystem that answers every request after
``--latency-ms`` (object storage's per-request latency; the files are synthetic: one small
Parquet file's bytes behind every name). Today's reader (every rank lists and reads every
footer) against the index a Ray run's driver writes (data/streaming/index.py): requests before
the rank's first batch and seconds to it. And the first batch's wait: the rank's streams'
first windows read side by side (the loader's default) against one after another.

Mosaic ``streaming`` pins its own dependencies: make a virtualenv with
``bash benchmarks/streaming_mosaic_venv.sh DIR`` and pass ``--mosaic-python DIR/bin/python``
(its driver is ``benchmarks/streaming_mosaic.py``; the Parquet rows are converted to MDS once);
without it Mosaic is left out.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BATCH = 256
RESUME_AT = (0.0, 0.5, 0.9)


def write_data(folder: Path, rows: int, kind: str) -> Path:
    """``rows`` rows of ``kind`` ('features' or 'tokens') as Parquet, unless already there."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    done = folder / "_complete"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per_file = 100_000 if kind == "features" else 12_500
    for f, first in enumerate(range(0, rows, per_file)):
        n = min(per_file, rows - first)
        if kind == "features":
            x = rng.standard_normal((n, 16), dtype=np.float32)
            table = pa.table({
                "inputs": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 16),
                "labels": pa.array(rng.integers(0, 10, n)),
            })
        else:
            ids = rng.integers(0, 256, n * 128)
            table = pa.table({"input_ids": pa.FixedSizeListArray.from_arrays(pa.array(ids), 128)})
        pq.write_table(table, folder / f"part-{f:04d}.parquet", row_group_size=per_file // 10)
    done.touch()
    return folder


def peak_rss_mib() -> float:
    """The process's peak resident set plus its largest child's (loader workers), as the Mosaic
    driver counts it: pages a forked worker shares with its parent count twice."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + children) / 1024


def measure_streaming(folder: Path, resume: bool) -> dict:
    """StreamingLoader, one loader worker: an epoch, then the first batch after each resume."""
    from distributed_runner.data.loaders import build_dataloader

    def loader():
        spec = dict(type="StreamingLoader", batch_size=BATCH, num_workers=1, rank=0,
                    world_size=1, dataset=dict(type="ParquetShards", paths=str(folder)))
        return build_dataloader(spec, "train_dataloader", seed=0)

    out = epoch_figures(loader())
    if resume:
        out["resume_first_batch_s"] = {}
        for fraction in RESUME_AT:
            ld = loader()
            start = time.perf_counter()
            ld.sampler.resume_at(int(len(ld) * fraction) * BATCH)
            next(iter(ld))
            out["resume_first_batch_s"][str(fraction)] = time.perf_counter() - start
    return out


def epoch_figures(batches) -> dict:
    """Samples/s over one pass and the time to its first batch."""
    start, first, samples = time.perf_counter(), None, 0
    for batch in batches:
        if first is None:
            first = time.perf_counter() - start
        samples += len(next(iter(batch.values())))
    seconds = time.perf_counter() - start
    return {"samples": samples, "samples_per_s": samples / seconds, "first_batch_s": first}


def measure_ray_data(folder: Path, resume: bool) -> dict:
    """Ray Data on a local Ray of 2 CPUs: an epoch, then RayDataLoader's resume (iterate over the
    consumed batches) at each fraction."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ds = ray.data.read_parquet(str(folder))
    ds.count()  # the row count RayDataLoader's driver reads
    out = epoch_figures(ds.iter_torch_batches(batch_size=BATCH))
    if resume:
        steps = out["samples"] // BATCH
        out["resume_first_batch_s"] = {}
        for fraction in RESUME_AT:
            start = time.perf_counter()
            batches = iter(ds.iter_torch_batches(batch_size=BATCH))
            for _ in range(int(steps * fraction) + 1):  # the consumed ones, then the first
                next(batches)
            out["resume_first_batch_s"][str(fraction)] = time.perf_counter() - start
    ray.shutdown()
    return out


def run_startup(files: int, latency_ms: float, work: Path) -> dict:
    argv = [sys.executable, __file__, "--child", "startup", str(work), "--startup-files",
            str(files), "--latency-ms", str(latency_ms)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=3600,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if out.returncode:
        raise SystemExit(out.stderr.strip().splitlines()[-1][:300])
    return json.loads(out.stdout.strip().splitlines()[-1])


def child(reader: str, folder: str, resume: bool, args: argparse.Namespace | None = None) -> None:
    if reader == "startup" and args is not None:
        print(json.dumps(startup_figures(int(args.startup_files), args.latency_ms / 1000,
                                         Path(folder))))
        return
    measure = {"streaming": measure_streaming, "ray_data": measure_ray_data}[reader]
    out = measure(Path(folder), resume)
    out["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(out))


def run_child(reader: str, folder: Path, resume: bool, python: str = sys.executable) -> dict:
    if reader == "mosaic":
        columns = "inputs,labels" if folder.name.startswith("features") else "input_ids"
        argv = [python, str(ROOT / "benchmarks" / "streaming_mosaic.py"), str(folder),
                str(folder.parent / f"{folder.name}_mds"), "--batch-size", str(BATCH),
                "--num-workers", "1", "--columns", columns]
        argv += ["--resume-fraction", ",".join(str(f) for f in RESUME_AT) if resume else ""]
    else:
        argv = [sys.executable, __file__, "--child", reader, str(folder)]
        if resume:
            argv.append("--resume")
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(ROOT))
    out = subprocess.run(argv, capture_output=True, text=True, timeout=3600, env=env)
    if out.returncode:
        return {"error": out.stderr.strip().splitlines()[-1][:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


class SyntheticStore:
    """A pyarrow-like filesystem: the folder ``bucket`` lists ``names`` (one request, as one
    page of an object store's listing), every name holds ``payload``, and every request waits
    ``latency_s``; counts the requests."""

    def __init__(self, names: list[str], payload: bytes, latency_s: float) -> None:
        import threading

        self.names, self.payload, self.latency_s, self.requests = names, payload, latency_s, 0
        self._lock = threading.Lock()

    def _request(self) -> None:
        with self._lock:
            self.requests += 1
        time.sleep(self.latency_s)

    def get_file_info(self, path):
        import pyarrow.fs as pafs

        self._request()
        if isinstance(path, pafs.FileSelector):
            return [pafs.FileInfo(name, pafs.FileType.File) for name in self.names]
        kind = pafs.FileType.Directory if path == "bucket" else pafs.FileType.File
        return pafs.FileInfo(path, kind)

    def open_input_file(self, path):
        import pyarrow as pa

        self._request()
        return pa.BufferReader(self.payload)


def startup_figures(files: int, latency_s: float, work: Path) -> dict:
    """One rank (of 8) over ``files`` synthetic files: requests and seconds to its first batch,
    footers read by the rank (today) or the driver's index; and the first batch with the
    windows read one after another."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from distributed_runner.data.streaming import ParquetShards, StreamingLoader
    from distributed_runner.data.streaming import loader as loader_module
    from distributed_runner.data.streaming import shards as shards_module

    rows = 100
    table = pa.table({"inputs": pa.FixedSizeListArray.from_arrays(
        pa.array(np.zeros(rows * 16, np.float32)), 16), "labels": pa.array(np.arange(rows))})
    out = io.BytesIO()
    pq.write_table(table, out)
    names = [f"bucket/part-{i:06d}.parquet" for i in range(files)]
    index_uri = str(work / f"index-{files}.arrow")
    result: dict = {"files": files}
    for mode in ("footers", "index", "index, windows one by one"):
        store = SyntheticStore(names, out.getvalue(), latency_s)
        shards_module._open_filesystem = lambda path, options, store=store: (store, path)
        loader_module.READ_THREADS = 1 if mode.endswith("one by one") else 16
        start = time.perf_counter()
        if mode == "footers":
            shards = ParquetShards("bucket")
            shards.index().write(index_uri)  # what the driver writes, once per run
            store.requests = 0  # the driver's part aside: count the rank's own below
            start = time.perf_counter()
            shards = ParquetShards("bucket")
        else:
            shards = ParquetShards(names[0], index=index_uri)
        opened = time.perf_counter() - start
        metadata = store.requests
        loader = StreamingLoader(shards, batch_size=32, shuffle_window=256, rank=0, world_size=8)
        next(iter(loader))
        result[mode] = {"metadata_requests": metadata, "requests": store.requests,
                        "open_s": opened, "first_batch_s": time.perf_counter() - start}
    return result


def startup_table(results: list[dict], latency_ms: float) -> list[str]:
    lines = [f"startup: one rank of 8, {latency_ms:g} ms a request, files of 100 rows",
             "| files | reader | metadata requests | requests to the first batch | "
             "open s | first batch s |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        for mode in ("footers", "index", "index, windows one by one"):
            f = r[mode]
            lines.append(f"| {r['files']:,} | {mode} | {f['metadata_requests']:,} | "
                         f"{f['requests']:,} | {f['open_s']:.2f} | {f['first_batch_s']:.2f} |")
    return lines


def fmt(figures: dict, key: str, digits: int = 2) -> str:
    if "error" in figures:
        return "error"
    value = figures.get(key)
    return "not run" if value is None else f"{value:,.{digits}f}"


def table(results: dict, sizes: list[int]) -> list[str]:
    columns = ["data", "reader", "samples/s", "first batch s",
               "resume first batch s (0 / 50 / 90 %)",
               *(f"peak RSS MiB @ {n:,} rows" for n in sizes)]
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for (data, reader), runs in results.items():
        main = runs["main"]
        resume = main.get("resume_first_batch_s") or {}
        resumed = " / ".join(f"{resume[str(f)]:.2f}" for f in RESUME_AT) if resume else "-"
        cells = [data, reader, fmt(main, "samples_per_s", 0), fmt(main, "first_batch_s"), resumed,
                 *(fmt(runs.get(n, {}), "peak_rss_mib", 0) for n in sizes)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--memory-rows", default="1000000,4000000")
    p.add_argument("--mosaic-python", default=None)
    p.add_argument("--skip-ray-data", action="store_true")
    p.add_argument("--work-dir", default="/tmp/drun_bench_streaming")
    p.add_argument("--startup-files", default="1000,10000,100000")
    p.add_argument("--latency-ms", type=float, default=5.0)
    p.add_argument("--child", nargs=2, metavar=("READER", "FOLDER"))
    p.add_argument("--resume", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(*args.child, args.resume, args)
        return
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    sizes = [int(n) for n in args.memory_rows.split(",") if n]
    readers = ["streaming"] + ([] if args.skip_ray_data else ["ray_data"])
    readers += ["mosaic"] if args.mosaic_python else []
    results: dict = {}
    for kind, rows in (("features", args.rows), ("tokens", args.rows // 8)):
        folder = write_data(work / f"{kind}_{rows}", rows, kind)
        for reader in readers:
            python = args.mosaic_python or sys.executable
            results[(f"{kind} {rows:,} rows", reader)] = {
                "main": run_child(reader, folder, resume=True, python=python)}
    for n in sizes:
        folder = write_data(work / f"features_{n}", n, "features")
        for reader in readers:
            python = args.mosaic_python or sys.executable
            results[(f"features {args.rows:,} rows", reader)][n] = run_child(
                reader, folder, resume=False, python=python)
    print(f"streaming_data: batch {BATCH}, one loader worker (Ray Data: its read tasks on 2 CPUs)")
    print("\n".join(table(results, sizes)))
    counts = [int(n) for n in args.startup_files.split(",") if n and int(n)]
    if counts:  # each in a child: it replaces the shards' filesystem
        print("\n".join(startup_table(
            [run_startup(n, args.latency_ms, work) for n in counts], args.latency_ms)))


if __name__ == "__main__":
    main()
