"""Packing token documents into rows of a fixed length, per stream.

``pack=dict(column='tokens', seq_len=L, eos_token_id=E)``: a stream's documents, in its order,
each followed by ``E``, are one sequence of tokens cut into rows of ``L``; a row is
``input_ids`` and ``labels`` (the same tokens: the model shifts them, as Hugging Face's causal
models and ``group_texts`` in transformers' examples do). A stream's tokens short of a whole row
at the end of the epoch are dropped, not padded.

Where a packed row starts cannot be computed without the lengths of every document before it, so
a stream's position is a **cursor** — ``(rows done, window, document in window, token in
document)`` — that the loader records for every row it hands out; checkpoints keep the cursors of
all streams (the ``train_data`` part), and a resumed run, at any world size, starts each stream at
its cursor without reading what was trained. Without a cursor (a checkpoint written before this
part existed) a stream finds its place by counting the tokens of its trained documents, which reads
them: a warning says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.log import current_logger
from distributed_runner.data.streaming.columns import index_array
from distributed_runner.data.streaming.order import EpochOrder
from distributed_runner.data.streaming.shards import ParquetShards

START = (0, 0, 0, 0)  # a stream's cursor before its first row


@dataclass(frozen=True)
class PackSpec:
    """The checked ``pack`` dict."""

    column: str
    seq_len: int
    eos_token_id: int

    @classmethod
    def parse(cls, spec: Any) -> PackSpec | None:
        if spec is None:
            return None
        if not isinstance(spec, dict):
            raise ArgumentError("pack", "must be dict(column=..., seq_len=..., eos_token_id=...)")
        unknown = sorted(set(spec) - {"column", "seq_len", "eos_token_id"})
        if unknown:
            raise ArgumentError(
                f"pack.{unknown[0]}", "unknown key: pack takes column, seq_len, eos_token_id"
            )
        for key, kind in (("column", str), ("seq_len", int), ("eos_token_id", int)):
            if not isinstance(spec.get(key), kind) or isinstance(spec.get(key), bool):
                raise ArgumentError(f"pack.{key}", f"missing or not a {kind.__name__}")
        if spec["seq_len"] < 1:
            raise ArgumentError("pack.seq_len", f"must be >= 1, got {spec['seq_len']}")
        return cls(spec["column"], spec["seq_len"], spec["eos_token_id"])


class PackedStream:
    """Packed rows of one stream, handed out in order from a cursor."""

    def __init__(
        self,
        shards: ParquetShards,
        order: EpochOrder,
        stream: int,
        spec: PackSpec,
        cursor: tuple[int, int, int, int] = START,
    ) -> None:
        self.shards, self.order, self.stream, self.spec = shards, order, stream, spec
        self.row, self.window, self.slot, self.offset = cursor
        self._docs: tuple[int, np.ndarray, np.ndarray] | None = None  # window, values, offsets
        self._block: tuple[int, Any] | None = None

    def rows(self, first: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows ``first .. stop - 1`` as a ``(n, seq_len)`` array, and each row's cursor after
        it (``(n, 4)``)."""
        if first != self.row:
            self._seek(first)
        length = self.spec.seq_len
        out = np.empty((stop - first, length), dtype=np.int64)
        cursors = np.empty((stop - first, 4), dtype=np.int64)
        for r in range(stop - first):
            filled = 0
            while filled < length:
                tokens = self._document()
                take = min(length - filled, len(tokens) - self.offset)
                out[r, filled : filled + take] = tokens[self.offset : self.offset + take]
                filled += take
                self._advance(take, len(tokens))
            self.row += 1
            cursors[r] = (self.row, self.window, self.slot, self.offset)
        return out, cursors

    def prepare(self, row: int) -> None:
        """Read the window the stream's cursor stands in, when ``row`` is where it stands (the
        loader reads its streams' windows side by side); a seek reads as it counts."""
        start, stop = self.order.window_span(self.stream, self.window)
        if row == self.row and stop > start:
            self._window_docs(self.window)

    def _advance(self, taken: int, doc_length: int) -> None:
        self.offset += taken
        if self.offset == doc_length:
            self.slot, self.offset = self.slot + 1, 0
            start, stop = self.order.window_span(self.stream, self.window)
            if self.slot == stop - start:
                self.window, self.slot = self.window + 1, 0

    def _document(self) -> np.ndarray:
        """The current document's tokens followed by the end-of-sequence token."""
        _, values, offsets = self._window_docs(self.window)
        doc = values[offsets[self.slot] : offsets[self.slot + 1]]
        return np.append(doc, self.spec.eos_token_id)

    def _seek(self, first: int) -> None:
        """Find row ``first`` by counting tokens from the stream's start (reads the trained
        documents: only without a cursor)."""
        current_logger().warning(
            "StreamingLoader: no position for stream %d in the checkpoint: counting the "
            "tokens of its first %d rows to find where it stands (this reads them)",
            self.stream,
            first,
        )
        self.row, self.window, self.slot, self.offset = START
        length = self.spec.seq_len
        skip = first * length
        while skip:
            doc_length = len(self._document())
            take = min(skip, doc_length - self.offset)
            skip -= take
            self._advance(take, doc_length)
        self.row = first

    def _window_docs(self, index: int) -> tuple[int, np.ndarray, np.ndarray]:
        import pyarrow as pa

        if self._docs is None or self._docs[0] != index:
            self._docs = None
            span = self.order.window_span(self.stream, index)
            pieces = [
                self._read(block).slice(lo, hi - lo)
                for block, lo, hi in self.order.pieces(self.stream, *span)
            ]
            column = pa.concat_tables(pieces).column(self.spec.column).combine_chunks()
            docs = column.take(index_array(self.order.window_permutation(self.stream, index)))
            offsets = docs.offsets.to_numpy()
            values = docs.values.to_numpy(zero_copy_only=False)
            self._docs = (index, values, offsets)
        return self._docs

    def _read(self, block: int) -> Any:
        if self._block is None or self._block[0] != block:
            self._block = None
            blocks = self.shards.blocks
            self._block = (block, self.shards.read_block(blocks[block], [self.spec.column]))
        return self._block[1]
