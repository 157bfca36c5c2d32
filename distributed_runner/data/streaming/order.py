"""The sample order of a streamed epoch, from ``(seed, epoch)`` alone.

Three steps, each drawn from its own seeded generator (never the global RNG):

1. **Blocks** (row groups) are permuted.
2. The blocks, in that order, are one sequence of ``N`` rows, cut into ``num_streams`` (``C``)
   contiguous **streams**: the first ``N % C`` of ``N // C + 1`` rows, the others of ``N // C``,
   so that every row is in one stream.
3. Each stream is shuffled inside **windows** of ``shuffle_window`` (``W``) consecutive rows.

Global position ``p`` (``0 <= p < N``) of the epoch is row ``p // C`` of stream ``p % C``: the
streams are interleaved, so consecutive samples come from ``C`` places far apart in the data, and
the longer streams' last rows are the epoch's last positions. Global batch ``g`` is positions
``g*G .. (g+1)*G - 1``; rank ``r`` of ``w`` takes every ``w``-th of them, starting at ``r`` —
with ``w`` dividing ``C`` those are exactly the rows of streams ``r, r + w, r + 2w ...``: a rank
reads its own ``C / w`` streams and no other rank's blocks.

Nothing here depends on the world size, the loader's workers or where a run was resumed, so
position ``p`` is the same sample in every run with the same data, seed, ``C`` and ``W``.

**Packed** (``StreamingLoader(pack=...)``): a stream's rows are its documents, concatenated and
cut into rows of ``seq_len`` tokens, so what must be equal across streams is their count of
*tokens*, known only per row group (from the Parquet footers, see ``shards.token_counts``). Packed
streams are therefore cut at row-group boundaries, each about ``1 / C`` of the tokens, and an epoch
has as many rounds as the shortest stream has packed rows: the longer ones leave up to about one
row group of tokens unused (another part each epoch, as the block order changes).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np


def _rng(*keys: int) -> np.random.Generator:
    return np.random.default_rng([int(k) for k in keys])


class EpochOrder:
    """One epoch's order over blocks of the given row counts."""

    def __init__(
        self,
        block_rows: Sequence[int],
        num_streams: int,
        shuffle_window: int,
        shuffle: bool,
        seed: int,
        epoch: int,
        block_tokens: Sequence[int] | None = None,
    ) -> None:
        self.num_streams, self.window = int(num_streams), int(shuffle_window)
        self.shuffle, self.seed, self.epoch = shuffle, int(seed), int(epoch)
        count = len(block_rows)
        self.block_order = _rng(seed, epoch, 0).permutation(count) if shuffle else np.arange(count)
        sizes = np.asarray(block_rows, dtype=np.int64)[self.block_order]
        self.block_starts = np.concatenate([[0], np.cumsum(sizes)])
        rows = int(self.block_starts[-1])
        if block_tokens is None:
            length, longer = divmod(rows, self.num_streams)  # the first `longer` take a row more
            self.stream_first = [c * length + min(c, longer) for c in range(self.num_streams)]
            self.stream_length = [length + (c < longer) for c in range(self.num_streams)]
            self.stream_tokens: list[int] = []
        else:
            self._cut_by_tokens(np.asarray(block_tokens, dtype=np.int64)[self.block_order])

    def _cut_by_tokens(self, tokens: np.ndarray) -> None:
        """Streams of whole blocks, cut where the running token count passes ``c / C`` of the
        total (packed streams: see the module docstring)."""
        ends = np.cumsum(tokens)
        targets = ends[-1] * np.arange(1, self.num_streams) // self.num_streams
        cuts = np.concatenate([[0], np.searchsorted(ends, targets, side="left") + 1])
        cuts = np.append(np.minimum(cuts, len(tokens)), len(tokens))
        self.stream_first = [int(self.block_starts[b]) for b in cuts[:-1]]
        self.stream_length = [
            int(self.block_starts[b] - self.block_starts[a]) for a, b in itertools.pairwise(cuts)
        ]
        sums = np.concatenate([[0], ends])
        self.stream_tokens = [int(sums[b] - sums[a]) for a, b in itertools.pairwise(cuts)]

    @property
    def samples(self) -> int:
        """Positions in an unpacked epoch: every row, ``N``."""
        return sum(self.stream_length)

    def pieces(self, stream: int, first: int, stop: int) -> list[tuple[int, int, int]]:
        """Rows ``first .. stop - 1`` of ``stream`` (before the window shuffle) as
        ``(block index, first row, stop row)`` pieces, in order."""
        out = []
        v, end = self.stream_first[stream] + first, self.stream_first[stream] + stop
        k = int(np.searchsorted(self.block_starts, v, side="right")) - 1
        while v < end:
            start = int(self.block_starts[k])
            upto = min(end, int(self.block_starts[k + 1]))
            out.append((int(self.block_order[k]), v - start, upto - start))
            v, k = upto, k + 1
        return out

    def window_span(self, stream: int, window: int) -> tuple[int, int]:
        """The stream rows window ``window`` covers."""
        first = window * self.window
        return first, min(first + self.window, self.stream_length[stream])

    def window_permutation(self, stream: int, window: int) -> np.ndarray:
        """Slot ``j`` of the window holds row ``perm[j]`` of it (counted from its first row)."""
        first, stop = self.window_span(stream, window)
        if not self.shuffle:
            return np.arange(stop - first)
        return _rng(self.seed, self.epoch, stream + 1, window + 1).permutation(stop - first)

    def source_of(self, position: int) -> tuple[int, int, int]:
        """``(block index, row in block)`` of global position ``position`` and its stream:
        what a test or a user asking "which sample was that" needs, without reading data."""
        stream, row = position % self.num_streams, position // self.num_streams
        window = row // self.window
        first, _ = self.window_span(stream, window)
        row_in_stream = first + int(self.window_permutation(stream, window)[row - first])
        ((block, start, _),) = self.pieces(stream, row_in_stream, row_in_stream + 1)
        return block, start, stream
