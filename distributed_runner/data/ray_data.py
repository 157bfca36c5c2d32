"""Ray Data as the training data: ``train_dataloader=dict(type='RayDataLoader',
dataset=dict(type='parquet', paths='data/train'), batch_size=32)``.

The driver reads the dataset (``ray.data.read_parquet``, through pyarrow) and hands it to the
TorchTrainer; each worker iterates its shard (``ray.train.get_dataset_shard``) with
``iter_torch_batches``, so reading and conversion run on Ray's CPUs, streamed. Batches are dicts of
column tensors, passed to the model as keyword arguments.

Resume: a streamed shard cannot start in the middle, so a run resumed mid-epoch skips the consumed
batches by iterating over them (the position is still exact; the skipped reads are paid for).
The launcher refuses a request that leaves Ray Data no CPU of its own (it would hang, starved).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError

READERS = {"parquet": "read_parquet"}


def build_ray_datasets(cfg: dict) -> dict:
    """On the driver: read the training dataset; its row count travels to the workers."""
    import ray.data

    loader = cfg["train_dataloader"]
    spec = dict(loader.get("dataset") or {})
    kind = spec.pop("type", None)
    if kind not in READERS:
        raise ConfigError(
            "train_dataloader.dataset.type",
            f"unknown Ray Data source {kind!r}: use one of {', '.join(READERS)}",
        )
    if "paths" not in spec:
        raise ConfigError(
            "train_dataloader.dataset.paths", "missing: the Parquet file(s) or folder to read"
        )
    dataset = getattr(ray.data, READERS[kind])(**spec)
    loader["num_rows"] = dataset.count()
    return {loader.get("split", "train"): dataset}


class _ShardPosition:
    """The sampler-like face of a RayDataLoader: epochs and where a resumed epoch starts."""

    def __init__(self, loader: RayDataLoader) -> None:
        self.loader = loader
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, samples_consumed: int) -> None:
        self.loader._skip_batches = samples_consumed // self.loader.batch_size


# why tensor parallelism refuses it (here on a worker, and on the Ray driver before any starts)
NOT_WITH_TP = (
    "RayDataLoader gives each worker its own rows, but the ranks of a tensor-parallel group "
    "(strategy.tp) need the same batches: use a dataset config or a StreamingLoader"
)


class RayDataLoader:
    """Iterates this worker's shard of a Ray Dataset as dicts of torch tensors."""

    def __init__(
        self,
        dataset: Any = None,
        batch_size: int = 32,
        split: str = "train",
        num_rows: int | None = None,
        drop_last: bool = False,
        local_shuffle_buffer_size: int | None = None,
        prefetch_batches: int = 1,
    ) -> None:
        if num_rows is None:
            raise ConfigError(
                "train_dataloader",
                "RayDataLoader runs under the Ray launcher (launcher=dict(type='ray', ...)) only",
            )
        if dist.get_tensor_parallel_size() > 1:
            raise ConfigError("train_dataloader", NOT_WITH_TP)
        self.dataset_spec = dataset
        self.batch_size = int(batch_size)
        self.split = split
        self.num_rows = int(num_rows)
        self.drop_last = drop_last
        self.local_shuffle_buffer_size = local_shuffle_buffer_size
        self.prefetch_batches = prefetch_batches
        self.sampler = _ShardPosition(self)
        self._skip_batches = 0

    def __len__(self) -> int:
        rows = math.ceil(self.num_rows / dist.get_world_size())
        return rows // self.batch_size if self.drop_last else math.ceil(rows / self.batch_size)

    def __iter__(self) -> Iterator[dict]:
        import ray.train

        shard = ray.train.get_dataset_shard(self.split)
        batches = shard.iter_torch_batches(
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            local_shuffle_buffer_size=self.local_shuffle_buffer_size,
            prefetch_batches=self.prefetch_batches,
        )
        skip, self._skip_batches = self._skip_batches, 0
        for i, batch in enumerate(batches):
            if i >= skip:
                yield batch
