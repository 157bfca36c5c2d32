"""Data loading: a resumable, rank-sharded sampler and dataloaders built from config dicts.

Exact resume needs two things from the data side:

* the order of an epoch depends only on ``(seed, epoch)`` — :class:`DefaultSampler` draws its
  permutation from its own generator, never from the global RNG;
* a resumed epoch starts at the first unconsumed batch without iterating over the consumed ones —
  :meth:`DefaultSampler.resume_at` sets where the next ``__iter__`` starts.

Dataloaders get their own ``torch.Generator`` too: a plain ``DataLoader`` draws its workers' base
seed from the global RNG each time an iterator is created, which would make a run resumed in the
middle of an epoch consume random numbers the uninterrupted run did not.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator, Sized
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data._utils.collate import default_collate as torch_default_collate

from distributed_runner.core import dist
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import (
    COLLATE_FUNCTIONS,
    DATA_SAMPLERS,
    DATASETS,
    TRANSFORMS,
)
from distributed_runner.core.signatures import accepts, check_arguments

if TYPE_CHECKING:
    from distributed_runner.data.ray_data import RayDataLoader
    from distributed_runner.data.streaming import StreamingLoader


def epoch_order(n: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """An epoch's sample order: a permutation drawn from ``seed + epoch`` alone (never the
    global RNG), or ``0..n-1``. DefaultSampler and elastic.GlobalBatchSampler share it."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


@DATA_SAMPLERS.register_module()
class DefaultSampler(Sampler[int]):
    """Shuffled (or ordered) indices, sharded by rank, padded so every rank gets as many.

    Like ``DistributedSampler``: the epoch's order is a permutation seeded by ``seed + epoch``,
    padded with its own first indices to a multiple of the world size (``round_up``), and rank
    ``r`` takes every ``world_size``-th index starting at ``r`` — disjoint and covering.
    ``len()`` is always the full shard, also while resuming in the middle of an epoch, so
    ``len(dataloader)`` stays the epoch length.
    """

    def __init__(
        self,
        dataset: Sized,
        shuffle: bool = True,
        seed: int | None = None,
        round_up: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = 0 if seed is None else int(seed)
        self.round_up = round_up
        # a tensor-parallel group's ranks read one share (core/dist.py): its data-parallel rank
        self.rank = dist.get_data_parallel_rank() if rank is None else rank
        self.world_size = dist.get_data_parallel_world_size() if world_size is None else world_size
        self.epoch = 0
        self._start = 0
        n = len(dataset)
        if round_up:
            self.num_samples = math.ceil(n / self.world_size)
            self.total_size = self.num_samples * self.world_size
        else:
            self.num_samples = math.ceil((n - self.rank) / self.world_size)
            self.total_size = n

    def indices(self) -> list[int]:
        """This rank's indices for the current epoch (the whole shard)."""
        n = len(self.dataset)
        order = epoch_order(n, self.shuffle, self.seed, self.epoch)
        if self.round_up and self.total_size > n:
            reps = math.ceil(self.total_size / n)
            order = (order * reps)[: self.total_size]
        return order[self.rank : self.total_size : self.world_size]

    def __iter__(self) -> Iterator[int]:
        shard = self.indices()
        start, self._start = self._start, 0
        return iter(shard[start:])

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, samples_consumed: int) -> None:
        """Make the next ``__iter__`` skip the first ``samples_consumed`` indices of the shard."""
        self._start = int(samples_consumed)


# Stack samples into batched tensors: torch's own function, registered as it is (a wrapper would
# cost a Python call per batch)
default_collate = COLLATE_FUNCTIONS.register_module("default_collate", module=torch_default_collate)


@COLLATE_FUNCTIONS.register_module()
def pseudo_collate(batch: list) -> Any:
    """Group samples field by field without stacking (variable-sized inputs)."""
    first = batch[0]
    if isinstance(first, dict):
        return {k: [b[k] for b in batch] for k in first}
    if isinstance(first, (tuple, list)):
        return [list(field) for field in zip(*batch, strict=True)]
    return list(batch)


def _seed_worker(worker_id: int, base_seed: int, rank: int) -> None:
    """Seed python/numpy/torch in a dataloader worker from (seed, rank, worker)."""
    seed = (base_seed + 1000 * rank + worker_id) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _build_collate(spec: Any, key: str) -> Any:
    if spec is None:
        return default_collate
    if callable(spec):
        return spec
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(key, "collate_fn must be a function, a registered name or dict(type=...)")
    fn = COLLATE_FUNCTIONS.resolve(spec["type"], key)
    extra = {k: v for k, v in spec.items() if k != "type"}
    return functools.partial(fn, **extra) if extra else fn


def _build_sampler(spec: Any, dataset: Dataset, seed: int, key: str) -> Any:
    if not isinstance(spec, dict):
        return spec
    args = dict(spec)
    cls = DATA_SAMPLERS.resolve(args.pop("type", "DefaultSampler"), key)
    if accepts(cls, "seed") and args.get("seed") is None:
        args["seed"] = seed
    data_arg = "dataset" if accepts(cls, "dataset") else "data_source"
    check_arguments(cls, args, key, supplied=[data_arg])
    return cls(**{data_arg: dataset}, **args)


def streaming_arguments(args: dict, key: str) -> tuple[dict, str]:
    """A StreamingLoader's arguments with ``dataset.pipeline`` moved to the loader's
    ``pipeline``, and the key its transforms are named by in errors. MMEngine users write a
    data set's transforms on the data set (``dataset=dict(type=..., pipeline=[...])``, and
    MMPretrain's SwitchRecipeHook switches ``dataset.pipeline``); here the loader runs them,
    after the position-based skip of a resume, and ParquetShards only reads. The driver's check
    and the workers' build both go through this, so neither refuses what the other takes."""
    dataset = args.get("dataset")
    if not isinstance(dataset, dict) or "pipeline" not in dataset:
        return args, f"{key}.pipeline"
    if args.get("pipeline"):
        raise ConfigError(
            f"{key}.dataset.pipeline",
            f"given with {key}.pipeline: keep one of them (the loader runs either)",
        )
    dataset = dict(dataset)
    pipeline = dataset.pop("pipeline")
    return {**args, "dataset": dataset, "pipeline": pipeline}, f"{key}.dataset.pipeline"


def _build_streaming(args: dict, key: str, seed: int) -> StreamingLoader:
    from distributed_runner.core.errors import ArgumentError
    from distributed_runner.data.streaming import StreamingLoader

    check_arguments(StreamingLoader, args, key)
    if "dataset" not in args:
        raise ConfigError(f"{key}.dataset", "missing: add dataset=dict(type='ParquetShards', ...)")
    args, pipeline_key = streaming_arguments(args, key)
    args["dataset"] = DATASETS.build(args["dataset"], f"{key}.dataset")
    args["pipeline"] = [
        TRANSFORMS.build(t, f"{pipeline_key}[{i}]")
        for i, t in enumerate(args.get("pipeline") or [])
    ]
    if args.get("seed") is None:
        args["seed"] = seed
    try:
        return StreamingLoader(**args)
    except ArgumentError as e:
        raise e.under(key) from e


def build_dataloader(
    spec: Any, key: str, seed: int
) -> DataLoader | RayDataLoader | StreamingLoader:
    """A ``DataLoader`` from a config dict (or the user's own ``DataLoader``, unchanged).

    Keys: ``dataset`` (config or object), ``batch_size``, ``sampler`` (default
    ``dict(type='DefaultSampler', shuffle=True)``), ``collate_fn`` and any other ``DataLoader``
    argument (``num_workers``, ``pin_memory``, ``drop_last``, ``persistent_workers`` ...).
    Under tensor parallelism its split is checked (:func:`check_split`).
    """
    loader = _build_loader(spec, key, seed)
    check_split(loader, key)
    return loader


def check_split(loader: Any, key: str) -> None:
    """Under tensor parallelism the ranks of a group must read the same batches: a sampler (or
    streamed loader) that splits over the whole world, or over a world it captured before the
    mesh existed, would give them different ones and train silently wrong. One line instead."""
    tp = dist.get_tensor_parallel_size()
    if tp == 1:
        return
    world, rank = dist.get_data_parallel_world_size(), dist.get_data_parallel_rank()
    batches = getattr(loader, "batch_sampler", None)
    for part in (loader, getattr(loader, "sampler", None), getattr(batches, "sampler", None)):
        replicas = getattr(part, "num_replicas", getattr(part, "world_size", None))
        if isinstance(replicas, int) and (replicas, getattr(part, "rank", rank)) != (world, rank):
            raise ConfigError(
                f"{key}.sampler",
                f"{type(part).__name__} splits the data over {replicas} ranks, but with "
                f"strategy.tp={tp} the {world} tensor-parallel groups each read one share: use "
                f"DefaultSampler from the config (it splits over the groups)",
            )


def _build_loader(spec: Any, key: str, seed: int) -> DataLoader | RayDataLoader | StreamingLoader:
    if isinstance(spec, DataLoader):
        return spec
    if not isinstance(spec, dict):
        raise ConfigError(key, "expected a dict (dataset=..., batch_size=...) or a DataLoader")
    args = dict(spec)
    if args.get("type") == "RayDataLoader":
        from distributed_runner.data.ray_data import RayDataLoader

        args.pop("type")
        check_arguments(RayDataLoader, args, key)
        return RayDataLoader(**args)
    if args.get("type") == "StreamingLoader":
        args.pop("type")
        return _build_streaming(args, key, seed)
    if "dataset" not in args:
        raise ConfigError(f"{key}.dataset", "missing: add dataset=dict(type=...)")
    if "shuffle" in args:
        raise ConfigError(
            f"{key}.shuffle",
            "use sampler=dict(type='DefaultSampler', shuffle=True) instead (it is "
            "resumable and rank-aware)",
        )
    dataset = DATASETS.build(args.pop("dataset"), f"{key}.dataset")
    sampler = _build_sampler(
        args.pop("sampler", {"type": "DefaultSampler", "shuffle": True}),
        dataset,
        seed,
        f"{key}.sampler",
    )
    collate = _build_collate(args.pop("collate_fn", None), f"{key}.collate_fn")
    if "batch_size" not in args:
        raise ConfigError(f"{key}.batch_size", "missing: add batch_size=N")
    args.pop("type", None)  # MMEngine configs sometimes say type='DataLoader'
    check_arguments(DataLoader, args, key, supplied=["dataset"])
    generator = torch.Generator()
    generator.manual_seed(seed)
    if args.get("num_workers", 0) > 0 and "worker_init_fn" not in args:
        args["worker_init_fn"] = functools.partial(
            _seed_worker, base_seed=seed, rank=dist.get_data_parallel_rank()
        )
    return DataLoader(dataset, sampler=sampler, collate_fn=collate, generator=generator, **args)


def seeded_dataloader(
    dataloader: Any, seed: int | None = None, diff_rank_seed: bool = False, key: str = "dataloader"
) -> DataLoader | RayDataLoader | StreamingLoader:
    """MMEngine's ``Runner.build_dataloader(cfg, seed=..., diff_rank_seed=...)``, which
    downstream hooks call to rebuild a loader mid-run (mmyolo's YOLOXModeSwitchHook); assign the
    result to ``runner.train_dataloader`` to train on it. ``seed=None`` is 0; ``diff_rank_seed``
    adds the rank."""
    seed = 0 if seed is None else int(seed)
    return build_dataloader(
        dataloader, key, seed + (dist.get_data_parallel_rank() if diff_rank_seed else 0)
    )


def resume_sampler(loader: Any, epoch: int, batches_consumed: int, offset: int = 0) -> bool:
    """Position ``loader`` at ``batches_consumed`` batches into ``epoch``, and ``offset`` samples
    of all ranks beyond them (a resume with a new global batch, data/world_change.py); False if
    it cannot.

    Works when the loader's sampler has ``resume_at`` (DefaultSampler: each rank skips its
    share, ``offset / w`` samples of it beyond the batches) or ``resume_at_position`` (the
    global-batch samplers and StreamingLoader: any sample position)."""
    sampler = getattr(loader, "sampler", None)
    if sampler is None or not hasattr(sampler, "resume_at"):
        if offset:
            raise ConfigError(
                "resume",
                "the checkpoint stopped inside a global batch of this run's size and "
                "train_dataloader's sampler cannot start at a sample: use DefaultSampler, or "
                "resume with the checkpoint's batch_size",
            )
        return False
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    at_position = getattr(sampler, "resume_at_position", None)
    if at_position is not None:
        at_position(batches_consumed, offset)
        return True
    beyond = offset // dist.get_data_parallel_world_size()  # each rank's part of the offset
    if offset and not isinstance(sampler, DefaultSampler):
        raise ConfigError(
            "resume",
            f"the checkpoint stopped inside a global batch of this run's size and "
            f"{type(sampler).__name__} cannot start at a sample: use DefaultSampler, or resume "
            "with the checkpoint's batch_size",
        )
    sampler.resume_at(batches_consumed * (loader.batch_size or 1) + beyond)
    return True
