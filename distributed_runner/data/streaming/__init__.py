"""Streamed training data: Parquet shards read block by block, in an order fixed by
``(seed, epoch)`` whatever the world size, resumed by position.

``shards`` finds the files and reads blocks (row groups); ``order`` is the epoch's order
(streams, windows); ``columns`` turns rows into columns and batches; ``loader`` is
``StreamingLoader``: a rank's part of each global batch, read by its workers.
May import: core, data.global_batch.
"""

from distributed_runner.data.streaming.loader import StreamingLoader
from distributed_runner.data.streaming.order import EpochOrder
from distributed_runner.data.streaming.shards import ParquetShards, ShardReadError

__all__ = ["EpochOrder", "ParquetShards", "ShardReadError", "StreamingLoader"]
