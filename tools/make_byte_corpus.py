"""Build the language-model example's corpus: Python's own standard library as bytes.

    python tools/make_byte_corpus.py [OUT_DIR] [--source DIR] [--block-size 128]
                                     [--val-percent 5] [--rows-per-shard 8192] [--seed 0]

Why this text: every machine that runs the example has it (no download), it is ~11 MB of real
code and docstrings, and bytes need no tokenizer (vocabulary 256).

What it writes (default OUT_DIR: ``data/byte_corpus``, git-ignored):

* ``OUT_DIR/train/part-NNNNN.parquet`` and ``OUT_DIR/val/part-NNNNN.parquet``: one row per
  block of ``block_size`` consecutive bytes, two columns, ``input_ids`` and ``labels``, each a
  fixed-size list of ``block_size`` int64. The columns are equal: a Hugging Face causal LM
  shifts the labels itself (position t predicts byte t+1). Two columns rather than one because
  Ray Data hands each column to the model as a keyword argument, and the model needs both.
* ``OUT_DIR/meta.json``: the settings, the row and file counts, and the Python version the text
  came from (another Python version gives another corpus).

How: every ``*.py`` file under ``--source`` (default: ``sysconfig.get_paths()['stdlib']``,
leaving out ``site-packages``, ``dist-packages`` and test folders), in sorted path order, goes to
the validation split when the first byte of the SHA-256 of its relative path is below
``val_percent`` of 256, else to training — a file is never in both, and the split does not depend
on the file's contents or on the machine. Each split is the concatenation of its files, each
followed by a NUL byte (a document boundary), cut into blocks (the remainder is dropped). The
blocks are shuffled with ``--seed``, so a streamed reader (Ray Data) sees mixed files and the
first rows of ``val`` are a fair sample.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
SEPARATOR = b"\0"


def source_files(source: Path) -> list[Path]:
    """The ``.py`` files under ``source`` in sorted order (installed packages and tests left out:
    the first are not the standard library, the second are mostly repetitive fixtures)."""
    found = [p for p in source.rglob("*.py")
             if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(source).parts[:-1])]
    return sorted(found, key=lambda p: p.relative_to(source).as_posix())


def is_val(relative: str, val_percent: float) -> bool:
    """A file's split from its path alone: stable across runs, machines and file edits."""
    first_byte = hashlib.sha256(relative.encode()).digest()[0]
    return first_byte < val_percent * 256 / 100


def split_streams(source: Path, val_percent: float) -> tuple[dict[str, bytearray], dict]:
    """Each split's bytes (files joined with NUL) and how many files went where."""
    streams = {"train": bytearray(), "val": bytearray()}
    counts = {"train": 0, "val": 0}
    for path in source_files(source):
        split = "val" if is_val(path.relative_to(source).as_posix(), val_percent) else "train"
        streams[split] += path.read_bytes() + SEPARATOR
        counts[split] += 1
    return streams, counts


def to_blocks(stream: bytes, block_size: int, seed: int) -> np.ndarray:
    """``[rows, block_size]`` uint8 blocks of the stream, rows shuffled with ``seed``."""
    rows = len(stream) // block_size
    blocks = np.frombuffer(bytes(stream[:rows * block_size]), dtype=np.uint8)
    blocks = blocks.reshape(rows, block_size)
    return blocks[np.random.default_rng(seed).permutation(rows)]


def write_shards(blocks: np.ndarray, folder: Path, rows_per_shard: int) -> int:
    """Write ``blocks`` as Parquet shards; returns how many files. Old shards are removed first
    so a smaller rebuild leaves no stale part behind."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("part-*.parquet"):
        old.unlink()
    block_size = blocks.shape[1]
    starts = range(0, len(blocks), rows_per_shard)
    for i, start in enumerate(starts):
        ids = blocks[start:start + rows_per_shard].astype(np.int64).ravel()
        column = pa.FixedSizeListArray.from_arrays(pa.array(ids), block_size)
        table = pa.table({"input_ids": column, "labels": column})
        pq.write_table(table, folder / f"part-{i:05d}.parquet", compression="zstd")
    return len(starts)


def build(out: Path, source: Path, block_size: int = 128, val_percent: float = 5.0,
          rows_per_shard: int = 8192, seed: int = 0) -> dict:
    """Build the corpus under ``out``; returns what ``meta.json`` records."""
    if not source.is_dir():
        raise SystemExit(f"--source: {source} is not a folder: give a folder of .py files")
    streams, files = split_streams(source, val_percent)
    meta = dict(source=str(source), python=sys.version.split()[0], block_size=block_size,
                val_percent=val_percent, seed=seed, separator=0, files=files, rows={},
                shards={}, columns=["input_ids", "labels"])
    for split, stream in streams.items():
        blocks = to_blocks(stream, block_size, seed)
        if len(blocks) == 0:
            raise SystemExit(f"--source: {source} gives the {split} split fewer than "
                             f"{block_size} bytes: use a bigger folder or a smaller "
                             f"--val-percent/--block-size")
        meta["rows"][split] = len(blocks)
        meta["shards"][split] = write_shards(blocks, out / split, rows_per_shard)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default="data/byte_corpus",
                        help="output folder (default data/byte_corpus)")
    parser.add_argument("--source", default=sysconfig.get_paths()["stdlib"],
                        help="folder of .py files (default: this Python's standard library)")
    parser.add_argument("--block-size", type=int, default=128, help="bytes per row (128)")
    parser.add_argument("--val-percent", type=float, default=5.0,
                        help="share of files, by path hash, held out for validation (5)")
    parser.add_argument("--rows-per-shard", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0, help="row shuffle seed (0)")
    args = parser.parse_args(argv)
    if args.block_size < 2 or args.rows_per_shard < 1 or not 0 < args.val_percent < 100:
        parser.error("--block-size must be >= 2, --rows-per-shard >= 1, --val-percent in (0, 100)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = Path(args.out)
    meta = build(out, Path(args.source), args.block_size, args.val_percent,
                 args.rows_per_shard, args.seed)
    for split in ("train", "val"):
        print(f"{split}: {meta['files'][split]} files, {meta['rows'][split]} rows of "
              f"{args.block_size} bytes, {meta['shards'][split]} shard(s) -> {out / split}")


if __name__ == "__main__":
    main()
