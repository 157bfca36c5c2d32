"""Training data: the resumable rank-sharded sampler and dataloaders built from config, Parquet
shards streamed in an order fixed by the seed (``streaming/``), Ray Data as a loader, and the
elastic rule (the same global batches at any world size, ``global_batch`` and ``elastic``).

The package forwards the names of the 0.1 module ``distributed_runner.data`` (now :mod:`.loaders`).
May import: core.
"""

from distributed_runner.core.moved import forward_names

__getattr__ = forward_names(__name__, "distributed_runner.data.loaders")
