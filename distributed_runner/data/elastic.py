"""Elastic worker groups: the same global batches, in the same order, at any world size.

``launcher=dict(type='ray', num_workers=(min, max))`` lets Ray Train run the group with as many
workers as the cluster has room for, between ``min`` and ``max``, and restart it at another size
when nodes leave or join (each restart resumes from the last checkpoint). For the run to stay
the run the config describes, what the optimizer sees must not depend on the size:

* **The global batch is fixed**: ``G = train_dataloader.batch_size x
  optim_wrapper.accumulative_counts x max`` workers — the batch the config describes at full
  size. At world size ``w`` every rank takes ``G / w`` samples of each global batch, in ``c``
  micro-batches of ``m <= batch_size`` samples (``m x c x w = G``): the configured batch size
  is the most a rank ever holds at once. Every size in ``min..max`` must divide ``G`` (checked
  on the driver before any worker starts).
* **One iteration is one optimizer step over one global batch**, at every size: the step
  (engine/step.py's ElasticStep) runs the rank's micro-batches (DDP all-reduces once, after the
  last), scales each loss by ``1/c`` and steps. So ``max_iters``, epoch lengths,
  ``param_scheduler`` positions, logging, validation and checkpoint intervals and the learning
  rate are the same at every size.
* **The sample order is fixed**: an epoch is the permutation ``DefaultSampler`` draws from
  ``(seed, epoch)``, cut into consecutive global batches (the last one completed by wrapping
  around, or dropped with ``drop_last=True``); rank ``r`` takes every ``w``-th sample of each,
  starting at ``r``. At full size with ``accumulative_counts=1`` that is what ``DefaultSampler``
  gives each rank, but for an epoch's last, shorter batch. A resumed run starts at the first
  global batch not yet trained, whatever size wrote the checkpoint.

What still depends on the size: the float summation order of the gradient (a resized run ends
within about 1e-5, relative, of one that never resized, not bit-equal); batch statistics
(BatchNorm normalises over a rank's micro-batch); per-rank random streams (data augmentation,
dropout): a checkpoint restores them only at the size that saved it. Losses must be means over
the batch (the usual), or the ``1/c`` scaling is not the global mean.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from itertools import islice
from typing import Any

from torch.utils.data import DataLoader

from distributed_runner.core.errors import ConfigError
from distributed_runner.data.global_batch import GlobalBatchPlan, MicroBatches
from distributed_runner.data.loaders import DefaultSampler, epoch_order
from distributed_runner.data.world_change import kept_global_batch


def elastic_range(launcher: Any) -> tuple[int, int] | None:
    """``(min, max)`` workers of an elastic launcher config, else None."""
    workers = launcher.get("num_workers") if isinstance(launcher, dict) else None
    if isinstance(workers, (list, tuple)):
        return int(workers[0]), int(workers[1])
    return None


def _accumulation(optim_wrapper: Any) -> int:
    if isinstance(optim_wrapper, dict):
        return int(optim_wrapper.get("accumulative_counts", 1))
    return int(getattr(optim_wrapper, "accumulative_counts", 1))


def check_global_batch(batch_size: int, accumulation: int, sizes: tuple[int, int]) -> int:
    """The global batch of an elastic run; a one-line error when some size in the range cannot
    split it evenly (every rank must do the same number of micro-batches: DDP's buffer
    broadcast and FSDP's all-gathers are collectives of every forward pass)."""
    low, high = sizes
    global_batch = batch_size * accumulation * high
    uneven = [w for w in range(low, high + 1) if global_batch % w]
    if uneven:
        multiple = math.lcm(*range(low, high + 1))
        raise ConfigError(
            "launcher.num_workers",
            f"the global batch {global_batch} (train_dataloader.batch_size "
            f"{batch_size} x accumulative_counts {accumulation} x {high} workers) "
            f"does not split evenly over {uneven[0]} workers: make it a multiple "
            f"of {multiple} or narrow the range",
        )
    return global_batch


def _check_streams(num_streams: Any, sizes: tuple[int, int]) -> None:
    """Every size of the group must divide a StreamingLoader's streams (each rank reads whole
    streams)."""
    if not isinstance(num_streams, int):
        return
    uneven = [w for w in range(sizes[0], sizes[1] + 1) if num_streams % w]
    if uneven:
        raise ConfigError(
            "train_dataloader.num_streams",
            f"{num_streams} streams cannot be split over {uneven[0]} workers: make it a "
            f"multiple of {math.lcm(*range(sizes[0], sizes[1] + 1))} or narrow the range",
        )


def check_elastic_config(cfg: dict) -> None:
    """The driver's check of an elastic config, before any worker starts."""
    sizes = elastic_range(cfg.get("launcher"))
    loader = cfg.get("train_dataloader")
    if sizes is None or not isinstance(loader, dict):
        return
    if loader.get("type") == "RayDataLoader":
        raise ConfigError(
            "train_dataloader.type",
            "elastic workers (num_workers=(min, max)) need DefaultSampler over a map-style "
            "dataset, or type='StreamingLoader'",
        )
    if loader.get("type") == "StreamingLoader":
        _check_streams(loader.get("num_streams", 64), sizes)
        sampler: Any = {}
    else:
        sampler = loader.get("sampler") or {}
    if isinstance(sampler, dict) and sampler.get("type", "DefaultSampler") != "DefaultSampler":
        raise ConfigError(
            "train_dataloader.sampler",
            "elastic workers (num_workers=(min, max)) need type='DefaultSampler'",
        )
    if isinstance(loader.get("batch_size"), int):
        check_global_batch(
            loader["batch_size"], _accumulation(cfg.get("optim_wrapper") or {}), sizes
        )


class GlobalBatchSampler:
    """A ``batch_sampler``: this rank's micro-batches of each global batch, epoch after epoch.

    ``set_epoch`` and ``resume_at(steps)`` as :class:`DefaultSampler` (``resume_at`` counts
    global batches: the loader's ``batch_size`` is None, as for any batch sampler)."""

    def __init__(
        self,
        dataset: Any,
        plan: GlobalBatchPlan,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        self.dataset, self.plan, self.shuffle, self.seed = dataset, plan, shuffle, seed
        n, size = len(dataset), plan.global_batch
        self.steps = n // size if drop_last else math.ceil(n / size)
        if self.steps < 1:
            raise ConfigError(
                "train_dataloader",
                f"the dataset has {n} samples, fewer than one global batch ({size})",
            )
        self.epoch = 0
        self._start = 0

    def order(self) -> list[int]:
        """The epoch's sample order, as ``DefaultSampler`` draws it, wrapped to whole batches."""
        n = len(self.dataset)
        order = epoch_order(n, self.shuffle, self.seed, self.epoch)
        total = self.steps * self.plan.global_batch
        return (order * math.ceil(total / n))[:total]

    def __iter__(self) -> Iterator[list[int]]:
        plan, order = self.plan, self.order()
        start, self._start = self._start, 0
        for step in range(start, self.steps):
            first = step * plan.global_batch
            share = order[first + plan.rank : first + plan.global_batch : plan.world_size]
            for j in range(plan.micro_batches):
                yield share[j * plan.micro_batch : (j + 1) * plan.micro_batch]

    def __len__(self) -> int:
        return self.steps * self.plan.micro_batches

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, steps_consumed: int) -> None:
        self._start = int(steps_consumed)


class GlobalBatchLoader:
    """Yields one :class:`MicroBatches` per global batch; ``len()`` is global batches per
    epoch. ``sampler`` is the :class:`GlobalBatchSampler` (for DistSamplerSeedHook and
    resume)."""

    batch_size = None

    def __init__(self, loader: DataLoader, plan: GlobalBatchPlan) -> None:
        if not isinstance(loader.batch_sampler, GlobalBatchSampler):
            raise TypeError(
                "GlobalBatchLoader needs a DataLoader whose batch_sampler is a "
                "GlobalBatchSampler (see regroup)"
            )
        self.loader, self.plan = loader, plan
        self.sampler: GlobalBatchSampler = loader.batch_sampler
        self.dataset = loader.dataset

    def __len__(self) -> int:
        return self.sampler.steps

    def __iter__(self) -> Iterator[MicroBatches]:
        batches = iter(self.loader)
        while True:
            group = MicroBatches(islice(batches, self.plan.micro_batches))
            if not group:
                return
            yield group


def regroup(loader: Any, plan: GlobalBatchPlan) -> GlobalBatchLoader:
    """``loader`` (built from ``train_dataloader``) re-cut into global batches: the same
    dataset, collate function, workers and generator; a :class:`GlobalBatchSampler` in place of
    its ``DefaultSampler``."""
    sampler = getattr(loader, "sampler", None)
    if not isinstance(loader, DataLoader) or not isinstance(sampler, DefaultSampler):
        raise ConfigError(
            "train_dataloader.sampler",
            "elastic workers (num_workers=(min, max)) need a DataLoader with DefaultSampler",
        )
    batches = GlobalBatchSampler(
        loader.dataset,
        plan,
        sampler.shuffle,
        sampler.seed,
        drop_last=loader.drop_last or not sampler.round_up,
    )
    keep = (
        "num_workers",
        "collate_fn",
        "pin_memory",
        "timeout",
        "worker_init_fn",
        "multiprocessing_context",
        "generator",
        "persistent_workers",
    )
    args = {key: getattr(loader, key) for key in keep}
    if loader.num_workers > 0:
        args["prefetch_factor"] = loader.prefetch_factor
    return GlobalBatchLoader(DataLoader(loader.dataset, batch_sampler=batches, **args), plan)


def elastic_training(
    loader: Any,
    optim_wrapper: Any,
    launcher: Any,
    world_size: int,
    rank: int,
    resumed: dict | None = None,
    logger: logging.Logger | None = None,
) -> tuple[Any, Any, GlobalBatchPlan | None]:
    """The train loader and optim_wrapper config as the run uses them, and the plan: an elastic
    run's (re-cut into global batches; accumulation done by the step, engine/step.py's
    ElasticStep), or a fixed-size run's resumed at another world size (``resumed``: the
    checkpoint's meta; its global batch is kept, see :mod:`.world_change`); unchanged and None
    otherwise."""
    sizes = elastic_range(launcher)
    if sizes is None:
        plan = kept_global_batch(
            loader, world_size, rank, resumed or {}, logger or logging.getLogger(__name__)
        )
        if plan is None:
            return loader, optim_wrapper, None
        return recut(loader, plan), optim_wrapper, plan
    accumulation = _accumulation(optim_wrapper)
    batch_size = getattr(loader, "batch_size", None)
    if not isinstance(batch_size, int):
        raise ConfigError("train_dataloader.batch_size", "elastic workers need batch_size=N")
    global_batch = check_global_batch(batch_size, accumulation, sizes)
    if global_batch % world_size:
        raise ConfigError(
            "launcher.num_workers",
            f"{world_size} workers cannot split the global batch {global_batch} evenly",
        )
    if accumulation > 1:
        if not isinstance(optim_wrapper, dict):
            raise ConfigError(
                "optim_wrapper",
                "elastic workers with accumulative_counts > 1 need optim_wrapper as a config dict",
            )
        optim_wrapper = {**optim_wrapper, "accumulative_counts": 1}
    plan = GlobalBatchPlan.build(global_batch, batch_size, world_size, rank)
    return recut(loader, plan), optim_wrapper, plan


def recut(loader: Any, plan: GlobalBatchPlan) -> Any:
    """``loader`` yielding this rank's share of ``plan``'s global batches as MicroBatches."""
    use_global_batches = getattr(loader, "use_global_batches", None)  # StreamingLoader
    if use_global_batches is not None:
        return use_global_batches(plan)
    return regroup(loader, plan)
