"""StreamingLoader: this rank's part of each global batch of a streamed epoch (see
:mod:`.order` for the order), read block by block by the loader's workers.

**Workers.** The rank's ``C / w`` streams are dealt to its ``num_workers`` worker processes
(stream ``s`` to worker ``s % num_workers``). The epoch is cut into *chunks* of whole rounds (a
round: one row from each of the rank's streams); for every chunk each worker hands over the rows
of its streams, run through the ``pipeline`` and stacked by column, and the loader merges the
workers' parts back into position order and cuts batches. torch's ``DataLoader`` takes the
workers' outputs in turn, so the merge needs no sorting across chunks and the batches come in the
same order with any number of workers.

**Resume by position.** ``resume_at`` names the first global batch not yet trained
(``resume_at_position`` any sample, for a resume with a new global batch: the rest of that
epoch is cut into global batches from there); each stream then starts at its first row at or
after it. Only the window holding that row is read (its rows
before it are fetched with the block, as Parquet fetches whole row groups, but neither converted
nor passed to the pipeline), so a run resumed at 90 % of an epoch starts about as fast as one at
0 %.

**Memory.** Each stream holds one shuffle window (``shuffle_window`` rows of the chosen columns)
and, while it fills the window, one row group. A rank holds ``C / w`` streams, spread over its
workers: at most ``(C / w) x (shuffle_window + largest row group)`` rows, whatever the size of
the data set.

**Random transforms** get the same draws in every run: before a sample enters the pipeline,
Python's, NumPy's and torch's generators are seeded from ``(seed, epoch, position)``.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from distributed_runner.core import dist
from distributed_runner.core.errors import ArgumentError, ConfigError
from distributed_runner.core.log import current_logger
from distributed_runner.core.registry import DATASETS, TRANSFORMS
from distributed_runner.data.global_batch import GlobalBatchPlan, MicroBatches, tail_step
from distributed_runner.data.streaming.columns import (
    columnize,
    index_array,
    table_columns,
    to_batch,
)
from distributed_runner.data.streaming.order import EpochOrder
from distributed_runner.data.streaming.pack import START, PackedStream, PackSpec
from distributed_runner.data.streaming.shards import ParquetShards, ShardReadError

STREAM, CURSOR = "_stream", "_cursor"  # packed rows' bookkeeping columns, never in a batch
CHUNK_ROWS = 8192  # rows a rank's workers hand over at a time (all its streams together)
READ_THREADS = 16  # windows a loader worker reads at once (pyarrow's reads release the GIL)


@dataclass(frozen=True)
class RankShare:
    """What one rank reads of an epoch: its streams, and the rank samples ``first .. stop - 1``
    (rank sample ``k`` is round ``k // per_round``, stream ``rank + (k % per_round) * world``)."""

    rank: int
    world_size: int
    num_streams: int
    first: int
    stop: int

    @property
    def per_round(self) -> int:
        return self.num_streams // self.world_size

    def stream(self, local: int) -> int:
        return self.rank + local * self.world_size

    def rows_in(self, local: int, round_first: int, round_stop: int) -> tuple[int, int]:
        """The rows of local stream ``local`` this share takes in rounds ``round_first ..
        round_stop - 1`` (a stream row is its round)."""
        lo = round_first if round_first * self.per_round + local >= self.first else round_first + 1
        last = round_stop - 1
        hi = round_stop if last * self.per_round + local < self.stop else last
        return lo, max(lo, hi)


class _StreamReader:
    """Rows of one stream in epoch order; holds its current window and the last block read."""

    def __init__(self, shards: ParquetShards, order: EpochOrder, stream: int) -> None:
        self.shards, self.order, self.stream = shards, order, stream
        self._window: tuple[int, Any, np.ndarray] | None = None
        self._block: tuple[int, Any] | None = None

    def prepare(self, row: int) -> None:
        """Read the window holding stream row ``row`` (the loader reads its streams' windows
        side by side: _ShareReader)."""
        if row < self.order.stream_length[self.stream]:
            self._load_window(row // self.order.window)

    def rows(self, first: int, stop: int) -> Any:
        """Rows ``first .. stop - 1`` of the stream (after the window shuffle), one table."""
        import pyarrow as pa

        parts, row = [], first
        while row < stop:
            index = row // self.order.window
            start, end = self.order.window_span(self.stream, index)
            table, perm = self._load_window(index)
            upto = min(stop, end)
            parts.append(table.take(index_array(perm[row - start : upto - start])))
            row = upto
        return parts[0] if len(parts) == 1 else pa.concat_tables(parts)

    def _load_window(self, index: int) -> tuple[Any, np.ndarray]:
        import pyarrow as pa

        if self._window is None or self._window[0] != index:
            self._window = None  # free the old window before reading the next one
            span = self.order.window_span(self.stream, index)
            pieces = [
                self._read(block).slice(lo, hi - lo)
                for block, lo, hi in self.order.pieces(self.stream, *span)
            ]
            table = pa.concat_tables(pieces).combine_chunks()
            self._window = (index, table, self.order.window_permutation(self.stream, index))
        return self._window[1], self._window[2]

    def _read(self, block: int) -> Any:
        if self._block is None or self._block[0] != block:
            self._block = None
            self._block = (block, self.shards.read_block(self.shards.blocks[block]))
        return self._block[1]


class _ShareReader(IterableDataset):
    """One item per chunk: ``[(local stream, first row, columns), ...]`` for the streams this
    worker owns (all of them without workers)."""

    def __init__(
        self,
        loader: StreamingLoader,
        share: RankShare,
        rounds_per_chunk: int,
        from_start: bool = False,
        first_rounds: int | None = None,
    ) -> None:
        self.loader, self.share, self.rounds_per_chunk = loader, share, rounds_per_chunk
        # the first chunk only as long as the first batch needs: it is what training waits for
        self.first_rounds = rounds_per_chunk if first_rounds is None else first_rounds
        self.order = loader.epoch_order()
        self.from_start = from_start  # packed: each stream from its start, not its cursor

    def chunk_rounds(self) -> list[tuple[int, int]]:
        share = self.share
        if share.first >= share.stop:
            return []
        first, last = share.first // share.per_round, (share.stop - 1) // share.per_round
        step, opening = self.rounds_per_chunk, min(self.first_rounds, self.rounds_per_chunk)
        chunks = [(first, min(first + opening, last + 1))]
        rest = chunks[0][1]
        return chunks + [(r, min(r + step, last + 1)) for r in range(rest, last + 1, step)]

    def __iter__(self) -> Iterator[list]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        owned = range(worker, self.share.per_round, workers)
        readers = {s: self._reader(self.share.stream(s)) for s in owned}
        with ThreadPoolExecutor(max_workers=max(1, min(READ_THREADS, len(readers)))) as pool:
            for round_first, round_stop in self.chunk_rounds():
                spans = {s: self.share.rows_in(s, round_first, round_stop) for s in readers}
                # the windows a chunk starts in, read side by side (the first batch waits for one
                # window of each stream: storage latency once, not once per stream)
                firsts = [spans[s][0] for s in readers]
                list(pool.map(lambda reader, row: reader.prepare(row), readers.values(), firsts))
                item = []
                for local, reader in readers.items():
                    lo, hi = spans[local]
                    if hi > lo:
                        item.append((local, lo, self._columns(reader, local, lo, hi)))
                yield item

    def _reader(self, stream: int) -> _StreamReader | PackedStream:
        loader = self.loader
        if loader.pack is None:
            return _StreamReader(loader.dataset, self.order, stream)
        cursor = START if self.from_start else tuple(loader.cursors.get(stream, START))
        return PackedStream(loader.dataset, self.order, stream, loader.pack, cursor)  # type: ignore[arg-type]

    def _columns(self, reader: _StreamReader | PackedStream, local: int, lo: int, hi: int) -> dict:
        if isinstance(reader, PackedStream):
            tokens, cursors = reader.rows(lo, hi)
            stream = np.full(hi - lo, reader.stream, dtype=np.int64)
            return {"input_ids": tokens, "labels": tokens.copy(), STREAM: stream, CURSOR: cursors}
        columns = table_columns(reader.rows(lo, hi))
        pipeline = self.loader.transforms
        if not pipeline:
            return columns
        samples = []
        for j in range(hi - lo):
            sample = {name: values[j] for name, values in columns.items()}
            position = (lo + j) * self.share.num_streams + self.share.stream(local)
            self.loader.seed_sample(position)
            for transform in pipeline:
                sample = transform(sample)
                if sample is None:
                    raise ConfigError(
                        "train_dataloader.pipeline",
                        f"{type(transform).__name__} dropped a sample: a streamed epoch keeps "
                        "every sample (filter the shards beforehand)",
                    )
            samples.append(sample)
        return columnize(samples)


def _merge(items: list[list], per_round: int) -> dict:
    """The workers' parts of one chunk in rank-sample order (by ``row * per_round + local``)."""
    parts = [part for item in items for part in item]
    if not parts:
        return {}
    keys = np.concatenate(
        [
            np.arange(lo, lo + len(next(iter(cols.values())))) * per_round + local
            for local, lo, cols in parts
        ]
    )
    order = np.argsort(keys, kind="stable")
    names = parts[0][2].keys()
    return {name: np.concatenate([cols[name] for _, _, cols in parts])[order] for name in names}


class _Batcher:
    """Cuts a stream of column chunks into batches of ``size`` rows (views into the chunks; a
    batch that straddles two chunks is the one copy)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.rest: dict | None = None  # the previous chunk's rows not yet in a batch

    def add(self, columns: dict) -> Iterator[dict]:
        if not columns:
            return
        if self.rest is not None:
            columns = {k: np.concatenate([self.rest[k], v]) for k, v in columns.items()}
            self.rest = None
        rows = len(next(iter(columns.values())))
        whole = rows - rows % self.size
        for first in range(0, whole, self.size):
            yield {k: v[first : first + self.size] for k, v in columns.items()}
        if whole < rows:
            self.rest = {k: v[whole:] for k, v in columns.items()}


@dataclass
class _Position:
    """The sampler-like face the loop and DistSamplerSeedHook talk to (``set_epoch``,
    ``resume_at``)."""

    loader: StreamingLoader
    epoch: int = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def resume_at(self, consumed: int) -> None:
        """``consumed`` samples of this rank (the loop's ``batches x batch_size``), or global
        batches when the loader yields global batches (its ``batch_size`` is None)."""
        steps = int(consumed) // (self.loader.batch_size or 1)
        self.loader.start_position = steps * self.loader.plan.global_batch

    def resume_at_position(self, batches: int, offset: int) -> None:
        """Start the next pass ``batches`` global batches and ``offset`` samples into the epoch."""
        self.loader.start_position = int(batches) * self.loader.plan.global_batch + int(offset)


class StreamingLoader:
    """Batches of Parquet shards streamed in an order fixed by ``(seed, epoch)``.

    ``train_dataloader=dict(type='StreamingLoader', dataset=dict(type='ParquetShards',
    paths=...), batch_size=B, shuffle=True, num_workers=N)``. Batches are dicts of column
    tensors (fixed-size list columns as 2-D tensors, strings and variable lists as lists), passed
    to the model as keyword arguments. ``num_streams`` (``C``) and ``shuffle_window`` (``W``)
    fix the order with the seed (see :mod:`.order`); every world size must divide ``C``.

    ``num_streams=None`` (the default) chooses ``C`` (:meth:`chosen_streams`): the largest of
    ``L, 2L, 4L, ...`` up to ``max(64, L)`` that the data fills (every stream a row; packed, a
    full global batch), where ``L`` is the world size, or the least common multiple of an
    elastic group's sizes (data/elastic.py). A resume takes the checkpoint's ``C`` (its meta
    records it), so the order stays the saved run's at any new world size.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool = True,
        num_workers: int = 0,
        pipeline: list | None = None,
        pack: dict | None = None,
        num_streams: int | None = None,
        shuffle_window: int = 1024,
        prefetch_factor: int = 2,
        drop_last: bool = False,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.dataset = DATASETS.build(dataset, "dataset")
        if not isinstance(self.dataset, ParquetShards):
            raise ArgumentError("dataset", "StreamingLoader reads dict(type='ParquetShards', ...)")
        self.batch_size: int | None = _positive(batch_size, "batch_size")
        self.shuffle, self.seed = bool(shuffle), 0 if seed is None else int(seed)
        self.auto_streams = num_streams is None  # chosen from the data: chosen_streams
        self.num_streams = 1 if num_streams is None else _positive(num_streams, "num_streams")
        self.shuffle_window = _positive(shuffle_window, "shuffle_window")
        self.prefetch_factor = _positive(prefetch_factor, "prefetch_factor")
        if not isinstance(drop_last, bool):
            raise ArgumentError("drop_last", f"must be True or False, got {drop_last!r}")
        self.drop_last = drop_last
        self.rank = dist.get_data_parallel_rank() if rank is None else int(rank)
        self.world_size = (
            dist.get_data_parallel_world_size() if world_size is None else int(world_size)
        )
        self.transforms = [
            TRANSFORMS.build(t, f"pipeline[{i}]") for i, t in enumerate(pipeline or [])
        ]
        self.pack = PackSpec.parse(pack)
        if self.pack is not None and self.transforms:
            raise ArgumentError(
                "pipeline", "pack counts tokens from the shards' footers: tokenize beforehand"
            )
        self._block_tokens = self._tokens_with_eos() if self.pack is not None else None
        self.sampler = _Position(self)
        self.start_position = 0  # the epoch's position the next pass starts at (a resume's)
        self.cursors: dict[int, list[int]] = {}  # packed streams: where each stands (see pack.py)
        self._loaded: dict = {}  # train_data state from a checkpoint, used by the next epoch pass
        self.plan = GlobalBatchPlan(
            self.batch_size * self.world_size, self.world_size, self.rank, self.batch_size, 1
        )
        self.grouped = False  # yield MicroBatches (an elastic group's global batches)
        self._asked_workers = int(num_workers)
        self.set_streams(self.chosen_streams(self.world_size) if self.auto_streams else None)

    def set_streams(self, count: int | None) -> None:
        """Read the epoch in ``count`` streams (None: the ones set), checked against the data
        and the ranks: an auto ``num_streams`` fixed for the run (the elastic group's choice,
        or a resumed checkpoint's), before the first epoch."""
        if count is not None:
            self.num_streams = int(count)
        self.rounds = self._count_rounds()
        self._check_sizes()
        self.num_workers = self._worker_count(self._asked_workers)

    def chosen_streams(self, multiple: int) -> int:
        """The auto ``num_streams`` for world sizes whose least common multiple is ``multiple``:
        the largest of ``multiple x 2^k`` up to ``max(64, multiple)`` that the data fills (every
        stream at least a row; packed, at least one full global batch); ``multiple`` when none
        does (the size checks then say why)."""
        ladder = [multiple]
        while ladder[-1] * 2 <= max(64, multiple):
            ladder.append(ladder[-1] * 2)
        for count in reversed(ladder):
            rounds = self._count_rounds(count)
            positions = len(self.dataset) if self.pack is None else count * rounds
            if len(self.dataset) >= count and positions >= self.plan.global_batch:
                return count
        return multiple

    def _check_sizes(self) -> None:
        rows, streams = len(self.dataset), self.num_streams
        if self.num_streams % self.world_size:
            raise ArgumentError(
                "num_streams",
                f"{streams} streams cannot be split over {self.world_size} ranks: set it to a "
                f"multiple of {self.world_size} (it fixes the sample order with the seed)",
            )
        if rows < streams:
            raise ArgumentError(
                "num_streams", f"{streams} streams need at least as many rows; the data has {rows}"
            )
        if self.pack is not None and self.steps < 1:
            raise ArgumentError(
                "pack",
                f"{sum(self._block_tokens or [])} tokens in {len(self.dataset.blocks)} row "
                f"groups leave {streams} streams no full global batch of {self.pack.seq_len}-"
                "token rows: lower num_streams or write smaller row groups",
            )
        if self.steps < 1:
            raise ConfigError(
                "train_dataloader",
                f"the data has {rows} rows, fewer than one global batch ({self.plan.global_batch})",
            )

    def _worker_count(self, asked: int) -> int:
        per_round = self.num_streams // self.world_size
        if asked > per_round:
            warnings.warn(
                f"train_dataloader.num_workers={asked}: this rank reads {per_round} streams, so "
                f"{per_round} workers are used (raise num_streams for more)",
                stacklevel=3,
            )
        return max(0, min(asked, per_round))

    def use_global_batches(self, plan: GlobalBatchPlan) -> StreamingLoader:
        """Yield this rank's share of ``plan``'s global batches as :class:`MicroBatches` (an
        elastic group: the step trains each as one optimizer step)."""
        self.plan, self.grouped, self.batch_size = plan, True, None
        self._check_sizes()
        return self

    def _tokens_with_eos(self) -> list[int]:
        assert self.pack is not None
        counts = self.dataset.token_counts(self.pack.column)
        return [t + b.rows for t, b in zip(counts, self.dataset.blocks, strict=True)]

    def _count_rounds(self, streams: int | None = None) -> int:
        """Rounds of an epoch (a round: one row of each stream). Unpacked: ``ceil(N / C)``, the
        last round only the ``N % C`` longer streams' last rows. Packed: the rows of the
        shortest stream any block order can give (at least ``T / C - 1`` minus the largest
        block's tokens, see order.py), so every epoch has the same length. ``streams``: ``C``
        (the loader's by default)."""
        streams = self.num_streams if streams is None else streams
        if self._block_tokens is None or self.pack is None:
            return _ceil_div(len(self.dataset), streams)
        if not self.shuffle or streams == 1:  # one block order: count it exactly
            order = self.epoch_order(streams)
            return min(order.stream_tokens) // self.pack.seq_len
        total, largest = sum(self._block_tokens), max(self._block_tokens)
        return max(0, total // streams - 1 - largest) // self.pack.seq_len

    @property
    def positions(self) -> int:
        """Samples in an epoch: every row unpacked; ``C x`` the rounds packed."""
        if self.pack is None:
            return len(self.dataset)
        return self.num_streams * self.rounds

    @property
    def steps(self) -> int:
        """Full global batches per epoch."""
        return self.positions // self.plan.global_batch

    @property
    def tail(self) -> int:
        """Samples of the epoch's last global batch when it is not full and is trained (0 when
        the positions divide into global batches, or with ``drop_last``)."""
        return 0 if self.drop_last else self.positions % self.plan.global_batch

    def layout(self, first: int) -> tuple[int, int]:
        """The full global batches and the last, smaller one's samples (0: none) of a pass that
        starts at position ``first`` of the epoch (0, or a resume's)."""
        rest, size = max(0, self.positions - first), self.plan.global_batch
        return rest // size, 0 if self.drop_last else rest % size

    @property
    def weighted_tail(self) -> bool:
        """Whether a last, smaller global batch (the epoch's, or the resumed pass's) comes as
        weighted MicroBatches in a run whose other steps are plain batches (several ranks:
        their shares differ; engine/step.py)."""
        tail = self.tail or self.layout(self.start_position)[1]
        return tail > 0 and self.plan.world_size > 1 and not self.grouped

    def __len__(self) -> int:
        return self.steps + (self.tail > 0)

    def epoch_order(self, streams: int | None = None) -> EpochOrder:
        rows = [b.rows for b in self.dataset.blocks]
        return EpochOrder(
            rows,
            self.num_streams if streams is None else streams,
            self.shuffle_window,
            self.shuffle,
            self.seed,
            self.sampler.epoch,
            self._block_tokens,
        )

    def seed_sample(self, position: int) -> None:
        """Seed the generators random transforms draw from, for the sample at ``position``."""
        value = int(
            np.random.SeedSequence([self.seed, self.sampler.epoch, position]).generate_state(1)[0]
        )
        random.seed(value)
        np.random.seed(value)
        torch.manual_seed(value)

    def share(self, first: int, full: int, tail: int) -> RankShare:
        """This rank's samples of a pass from position ``first`` (a multiple of ``w``), ``full``
        global batches then ``tail`` samples: rank sample ``k`` is position ``k * w + rank``,
        so the last, smaller global batch gives each rank the positions below the pass's end
        that are its own (some ranks one fewer, or none)."""
        plan = self.plan
        start = first // plan.world_size
        stop = start + full * (plan.global_batch // plan.world_size)
        if tail:
            stop += _ceil_div(max(0, tail - plan.rank), plan.world_size)
        return RankShare(plan.rank, plan.world_size, self.num_streams, start, stop)

    def __iter__(self) -> Iterator[Any]:
        first, self.start_position = self.start_position, 0
        loaded, self._loaded = self._loaded, {}
        same_epoch = first > 0 and loaded.get("epoch") == self.sampler.epoch
        self.cursors = (
            {int(c): v for c, v in loaded.get("cursors", {}).items()} if same_epoch else {}
        )
        steps, tail_size = self.layout(first)
        full = steps * self.plan.micro_batches  # micro-batches before the tail
        group: list = []
        tail: list[tuple[dict, int]] = []
        share = self.share(first, steps, tail_size)
        for index, (columns, rows) in enumerate(self._micro_batches(share)):
            batch = self._hand_out(columns)
            if index >= full:
                tail.append((batch, rows))
            elif not self.grouped:
                yield batch
            else:
                group.append(batch)
                if len(group) == self.plan.micro_batches:
                    yield MicroBatches(group)
                    group = []
        if tail_size:
            yield self._tail_step(tail, tail_size)

    def _micro_batches(self, share: RankShare) -> Iterator[tuple[dict, int]]:
        """The share's rows cut into micro-batches (the last one of the epoch may be shorter),
        with their row counts."""
        # a chunk of about CHUNK_ROWS rows: Arrow's per-call costs are paid per stream and chunk
        rounds = max(1, math.ceil(max(self.plan.micro_batch, CHUNK_ROWS) / share.per_round))
        # the first chunk: the rounds of the first micro-batch (counted from the share's start)
        opening = (share.first % share.per_round + self.plan.micro_batch) / share.per_round
        reader = _ShareReader(self, share, rounds, first_rounds=max(1, math.ceil(opening)))
        batcher = _Batcher(self.plan.micro_batch)
        for items in self._chunks(reader):
            for columns in batcher.add(_merge(items, share.per_round)):
                yield columns, self.plan.micro_batch
        rest = batcher.rest
        if rest is not None:
            yield rest, len(next(iter(rest.values())))

    def _tail_step(self, tail: list[tuple[dict, int]], size: int) -> Any:
        """The epoch's last, smaller global batch of ``S`` samples: alone, one smaller batch (or
        its micro-batches); on ``w`` ranks, MicroBatches whose losses are weighted ``w x rows /
        S`` so that the ranks' averaged gradient is the mean over the ``S`` samples, padded with
        weight-0 micro-batches to the count of the largest share (every rank makes as many
        forward passes: DDP and FSDP run collectives in them; a rank with no sample left passes
        one of its own, weighted 0)."""
        plan = self.plan
        if plan.world_size == 1 and not self.grouped:
            return tail[0][0]
        batches = [batch for batch, _ in tail]
        return tail_step(
            batches,
            [rows for _, rows in tail],
            plan,
            size,
            lambda: _first_row(batches[-1]) if batches else self._one_sample(),
        )

    def _one_sample(self) -> dict:
        """This rank's first sample of the epoch (rank sample 0), read apart from the pass: the
        weight-0 pass of a rank whose streams have no sample left for the last global batch."""
        plan = self.plan
        share = RankShare(plan.rank, plan.world_size, self.num_streams, 0, 1)
        (item,) = _ShareReader(self, share, 1, from_start=True)
        columns = _merge([item], share.per_round)
        columns.pop(STREAM, None), columns.pop(CURSOR, None)  # not trained: no cursor moves
        return to_batch(columns)

    def _hand_out(self, columns: dict) -> dict:
        """The batch the model gets; for packed rows, the streams' cursors move past it."""
        streams, cursors = columns.pop(STREAM, None), columns.pop(CURSOR, None)
        if streams is not None and cursors is not None:
            for stream, cursor in zip(streams.tolist(), cursors.tolist(), strict=True):
                self.cursors[stream] = cursor
        return to_batch(columns)

    # -- the checkpoint's train_data part (checkpoint/parts.py) ------------------------------
    def train_data_state(self) -> dict:
        """This rank's part: the data it was built on and, packed, its streams' cursors."""
        return {
            "epoch": self.sampler.epoch,
            "data": self.fingerprint(),
            "cursors": {str(c): list(v) for c, v in self.cursors.items()},
        }

    def restore_train_data(self, states: list[dict]) -> None:
        """Every rank's part (any world size): the cursors of all streams, for the next pass
        (after ``resume_at``); a warning when the data or the order's settings changed."""
        saved = next((s for s in states if s), {})
        if saved.get("data") not in (None, self.fingerprint()):
            current_logger().warning(
                "train_dataloader: the checkpoint was written over other data or settings "
                "(%s, now %s): the resumed order is not the saved run's",
                saved["data"],
                self.fingerprint(),
            )
            return
        cursors: dict = {}
        for state in states:
            cursors.update(state.get("cursors") or {})
        self._loaded = {"epoch": saved.get("epoch"), "cursors": cursors}

    def fingerprint(self) -> dict:
        """What fixes the order besides (seed, epoch)."""
        return {
            **self.dataset.fingerprint(),
            "seed": self.seed,
            "num_streams": self.num_streams,
            "shuffle_window": self.shuffle_window,
            "shuffle": self.shuffle,
            "pack": None if self.pack is None else [self.pack.column, self.pack.seq_len],
        }

    def _chunks(self, reader: _ShareReader) -> Iterator[list[list]]:
        """Each chunk's parts from every worker (in-process without workers)."""
        if self.num_workers == 0:
            for item in reader:
                yield [item]
            return
        loader = DataLoader(
            reader,
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_identity,
            prefetch_factor=self.prefetch_factor,
        )
        items = iter(loader)
        while True:
            try:
                parts = [next(items, None) for _ in range(self.num_workers)]
            except ShardReadError as e:
                raise ShardReadError.from_worker(e) from None
            if parts[0] is None:
                return
            yield [p for p in parts if p is not None]


def _identity(item: Any) -> Any:
    return item


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _first_row(batch: dict) -> dict:
    """A one-sample batch of ``batch``'s first row (tensors and lists alike)."""
    return {key: value[:1] for key, value in batch.items()}


def _positive(value: Any, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ArgumentError(key, f"must be an integer >= 1, got {value!r}")
    return int(value)
