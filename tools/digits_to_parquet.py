"""Write scikit-learn's digits as Parquet files for the Ray Data example.

    python tools/digits_to_parquet.py [OUT_DIR]     (default: data/digits_parquet)

Two files per split under OUT_DIR/{train,val}/ with columns ``inputs`` (64 float32 pixels in
[0, 1], a fixed-size list) and ``labels`` (int64); the split is DigitsDataset's. Row groups of 128
rows: a row group is what a streaming reader fetches at once, so small ones let each worker read
only its part (real data sets: a few MB to a few hundred MB per row group).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed_runner.examples.digits import DigitsDataset


def write_split(split: str, out: Path, files: int = 2) -> int:
    ds = DigitsDataset(split=split)
    pixels = ds.images.numpy().reshape(len(ds), 64).astype(np.float32)
    labels = ds.labels.numpy().astype(np.int64)
    (out / split).mkdir(parents=True, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(len(ds)), files)):
        table = pa.table({
            "inputs": pa.FixedSizeListArray.from_arrays(pa.array(pixels[part].ravel()), 64),
            "labels": pa.array(labels[part]),
        })
        pq.write_table(table, out / split / f"part-{i}.parquet", row_group_size=128)
    return len(ds)


def main(out: str = "data/digits_parquet") -> None:
    root = Path(out)
    for split in ("train", "val"):
        print(f"{split}: {write_split(split, root)} rows -> {root / split}")


if __name__ == "__main__":
    main(*sys.argv[1:])
