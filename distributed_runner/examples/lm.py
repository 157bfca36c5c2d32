"""The language-model example's data: byte-level Parquet shards of Python's standard library.

``tools/make_byte_corpus.py`` writes ``DATA_ROOT/{train,val}/part-*.parquet``: one row per block of
``block_size`` bytes, columns ``input_ids`` and ``labels`` (equal; a Hugging Face causal LM shifts
the labels itself). :class:`ByteShards` reads a split into memory as bytes (uint8: the default
11 MB corpus costs 11 MB, not the 8x of int64) and yields
``dict(input_ids=LongTensor[T], labels=LongTensor[T])`` — the keyword arguments of
``GPT2LMHeadModel.forward``. Used by ``configs/gpt_bytes.py`` through ``custom_imports``; the
Ray Data variant (``configs/gpt_bytes_raydata.py``) reads the same files with
``ray.data.read_parquet`` instead.

:func:`complete` continues a text prompt with a trained model, to see what it learned.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.registry import DATASETS

MAKE = "run python tools/make_byte_corpus.py first"


def shard_files(data_root: str | Path, split: str) -> list[Path]:
    """The split's Parquet shards in name order, or a one-line error saying how to make them."""
    folder = Path(data_root) / split
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    if not files:
        raise ArgumentError(
            "data_root", f"no shards in {folder}: {MAKE} (or point data_root at its output folder)"
        )
    return files


def read_blocks(files: list[Path], max_rows: int | None = None) -> np.ndarray:
    """``[rows, block_size]`` uint8 from the shards' ``input_ids`` column, reading no more files
    than ``max_rows`` needs. Blocks must all have one length (one corpus, one block size)."""
    parts: list[np.ndarray] = []
    rows = 0
    for path in files:
        column = pq.read_table(path, columns=["input_ids"]).column("input_ids").combine_chunks()
        width = getattr(column.type, "list_size", None)
        if width is None:
            raise ArgumentError("data_root", f"{path}: input_ids is not a fixed-size list: {MAKE}")
        values = column.flatten().to_numpy()
        if parts and width != parts[0].shape[1]:
            raise ArgumentError(
                "data_root",
                f"{path}: blocks of {width} bytes among blocks of "
                f"{parts[0].shape[1]}: rebuild the corpus into an "
                f"empty folder",
            )
        parts.append(values.astype(np.uint8).reshape(-1, width))
        rows += len(parts[-1])
        if max_rows is not None and rows >= max_rows:
            break
    blocks = np.concatenate(parts)
    return blocks[:max_rows] if max_rows is not None else blocks


@DATASETS.register_module()
class ByteShards(Dataset):
    """One split of the byte corpus as ``dict(input_ids=LongTensor[T], labels=LongTensor[T])``.

    ``data_root``: the folder ``tools/make_byte_corpus.py`` wrote. ``split``: ``'train'`` or
    ``'val'``. ``max_rows``: keep only the first N rows — the rows were shuffled when written, so
    this is a fair sample; the config uses it to keep validation to a few seconds on a CPU.
    ``block_size``: if given, must equal the corpus's (a model's ``n_positions`` must cover it),
    checked here so a mismatch is one line before training instead of an index error inside it.
    """

    def __init__(
        self,
        data_root: str = "data/byte_corpus",
        split: str = "train",
        max_rows: int | None = None,
        block_size: int | None = None,
    ) -> None:
        if split not in ("train", "val"):
            raise ArgumentError("split", f"got {split!r}; takes 'train' or 'val'")
        if max_rows is not None and max_rows < 1:
            raise ArgumentError("max_rows", f"got {max_rows}; takes a positive int or None")
        self.data_root = Path(data_root)
        self.split = split
        self.blocks = read_blocks(shard_files(data_root, split), max_rows)
        if block_size is not None and block_size != self.blocks.shape[1]:
            raise ArgumentError(
                "block_size",
                f"{block_size}, but the corpus in {data_root} has "
                f"blocks of {self.blocks.shape[1]}: rebuild it "
                f"with --block-size {block_size}",
            )

    @property
    def block_size(self) -> int:
        return int(self.blocks.shape[1])

    def meta(self) -> dict:
        """What the tool recorded about the corpus (``meta.json``), or ``{}``."""
        path = self.data_root / "meta.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, idx: int) -> dict:
        ids = torch.from_numpy(self.blocks[idx].astype(np.int64))
        return {"input_ids": ids, "labels": ids}


@torch.no_grad()
def complete(
    model: torch.nn.Module,
    prompt: str,
    max_new_bytes: int = 200,
    temperature: float = 0.8,
    top_k: int | None = 20,
    seed: int = 0,
) -> str:
    """``prompt`` continued by ``model`` byte by byte (sampled), decoded as UTF-8.

    Written out rather than ``model.generate`` so it needs nothing from the model but
    ``forward(input_ids).logits`` and ``config.n_positions`` (the context is cut to the last
    ``n_positions`` bytes).
    """
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    context = int(getattr(getattr(model, "config", None), "n_positions", 1024))
    ids = list(prompt.encode())
    for _ in range(max_new_bytes):
        window = torch.tensor([ids[-context:]], device=device)
        logits = model(input_ids=window).logits[0, -1].float().cpu() / max(temperature, 1e-5)
        if top_k is not None:
            cutoff = logits.topk(min(top_k, logits.numel())).values[-1]
            logits[logits < cutoff] = -float("inf")
        ids.append(int(torch.multinomial(logits.softmax(-1), 1, generator=generator)))
    model.train(was_training)
    return bytes(ids).decode("utf-8", errors="replace")
