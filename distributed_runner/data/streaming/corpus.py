"""Tokenizing a text corpus into Parquet shards with Ray Data (``tools/tokenize_corpus.py``):
the step runs on a Ray cluster's CPUs, and its workers import it from the installed package.

One document a row: ``tokens`` (int32 token ids) and ``path``; row groups of ``rows_per_group``
documents. ``StreamingLoader(pack=...)`` packs them into rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from distributed_runner.data.streaming.shards import ParquetShards


class Tokenize:
    """The ``map_batches`` step: documents (bytes) in, token lists out. A class, so Ray Data
    builds the tokenizer once per worker, not once per batch."""

    def __init__(self, tokenizer: str) -> None:
        self.kind = tokenizer
        self.hf = None
        if tokenizer != "bytes":
            from transformers import AutoTokenizer

            self.hf = AutoTokenizer.from_pretrained(tokenizer, local_files_only=True)

    def __call__(self, batch: dict[str, Any]) -> Any:
        texts = [bytes(b) for b in batch["bytes"]]
        if self.hf is None:
            tokens = [np.frombuffer(t, dtype=np.uint8).astype(np.int32) for t in texts]
        else:
            decoded = [t.decode("utf-8", errors="replace") for t in texts]
            ids = self.hf(decoded, add_special_tokens=False)["input_ids"]
            tokens = [np.asarray(i, dtype=np.int32) for i in ids]
        # an Arrow table, not a dict of NumPy arrays: Ray Data would store variable-length
        # arrays as its own tensor extension type, which other Parquet readers do not know
        return pa.table(
            {
                "tokens": pa.array(tokens, type=pa.list_(pa.int32())),
                "path": pa.array([str(p) for p in batch["path"]]),
            }
        )


def tokenize(
    source: str,
    out_dir: str,
    tokenizer: str = "bytes",
    glob: str = "*.txt",
    rows_per_group: int = 1024,
    actors: int = 2,
) -> int:
    """Read, tokenize and write with Ray Data (Ray must be initialised); returns the number of
    documents written (from the shards' footers: the pipeline is not run twice)."""
    import ray.data

    files: Any = source
    if "://" not in source:
        root = Path(source)
        if not root.is_dir():
            raise ValueError(f"SOURCE: {source} is not a folder")
        files = sorted(str(p) for p in root.rglob(glob) if p.is_file())
        if not files:
            raise ValueError(f"SOURCE: no file matching {glob!r} under {source}")
    ds = ray.data.read_binary_files(files, include_paths=True)
    ds = ds.map_batches(
        Tokenize,
        fn_constructor_args=(tokenizer,),
        concurrency=(1, actors),
        batch_size=256,
        batch_format="numpy",
    )
    ds.write_parquet(out_dir, row_group_size=rows_per_group)
    return len(ParquetShards(out_dir))
