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
  ``(seed, epoch)``, cut into consecutive global batches; rank ``r`` takes every ``w``-th sample
  of each, starting at ``r``. The epoch's last global batch, when the data set does not divide
  into whole ones, is the rest: the ranks' shares of it differ by a sample (or a rank has none
  and makes a weight-0 pass), and each loss is weighted so that the step is the mean over its
  samples (``drop_last=True`` drops it). So every sample is trained once an epoch, at every
  size, and a fixed-size run of ``DefaultSampler`` trains the same global batches
  (:func:`exact_epochs`). A resumed run starts at the first global batch not yet trained,
  whatever size wrote the checkpoint.

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
from distributed_runner.data.global_batch import GlobalBatchPlan, MicroBatches, tail_step
from distributed_runner.data.loaders import DefaultSampler, epoch_order
from distributed_runner.data.world_change import (
    kept_global_batch,
    kept_stream_count,
    new_global_batch,
)


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
        _check_streams(loader.get("num_streams"), sizes)  # None: chosen a multiple of all
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

    Every sample of the epoch once: the full global batches, then (unless ``drop_last``) the
    epoch's last, smaller one of ``tail`` samples, in which rank ``r`` takes the samples at
    ``r, r + w, ...`` below the epoch's end, in micro-batches of at most ``micro_batch``
    (:class:`GlobalBatchLoader` weights them and pads a short share: global_batch.tail_step).
    ``set_epoch`` and ``resume_at`` as :class:`DefaultSampler`; ``resume_at`` counts global
    batches, or this rank's samples when ``unit`` is its batch size (a loader that yields plain
    batches: :func:`exact_epochs`); ``resume_at_position`` starts a pass at any sample (a new
    global batch's resume), the rest of that pass cut into global batches from there."""

    def __init__(
        self,
        dataset: Any,
        plan: GlobalBatchPlan,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        unit: int = 1,
    ) -> None:
        self.dataset, self.plan, self.shuffle, self.seed = dataset, plan, shuffle, seed
        self.drop_last = drop_last
        n, size = len(dataset), plan.global_batch
        self.full_steps = n // size
        self.tail = 0 if drop_last else n % size
        self.steps = self.full_steps + (self.tail > 0)
        if self.steps < 1:
            raise ConfigError(
                "train_dataloader",
                f"the dataset has {n} samples, fewer than one global batch ({size})",
            )
        self.unit = unit
        self.epoch = 0
        self._first = 0  # the sample of the epoch the next pass starts at

    def layout(self, first: int) -> tuple[int, int]:
        """The full global batches and the last, smaller one's samples (0: none) of a pass that
        starts at sample ``first`` of the epoch (0, or a resume's position)."""
        rest = max(0, len(self.dataset) - first)
        size = self.plan.global_batch
        return rest // size, 0 if self.drop_last else rest % size

    @property
    def next_first(self) -> int:
        """The sample the next ``__iter__`` starts at (a resume's position; else 0)."""
        return self._first

    def order(self) -> list[int]:
        """The epoch's sample order, as ``DefaultSampler`` draws it."""
        return epoch_order(len(self.dataset), self.shuffle, self.seed, self.epoch)

    def __iter__(self) -> Iterator[list[int]]:
        # the resume position is taken now, not at the first batch: a pass that starts at the
        # epoch's end asks for none, and the next epoch must start at its beginning
        first, self._first = self._first, 0
        return self._indices(first, self.order())

    def _indices(self, first: int, order: list[int]) -> Iterator[list[int]]:
        plan = self.plan
        full, tail = self.layout(first)
        for step in range(full):
            start = first + step * plan.global_batch
            share = order[start + plan.rank : start + plan.global_batch : plan.world_size]
            for j in range(plan.micro_batches):
                yield share[j * plan.micro_batch : (j + 1) * plan.micro_batch]
        share = order[first + full * plan.global_batch + plan.rank :: plan.world_size]
        for i in range(0, len(share) if tail else 0, plan.micro_batch):
            yield share[i : i + plan.micro_batch]

    def tail_sizes(self, tail: int | None = None) -> list[int]:
        """This rank's micro-batch sizes in a pass's last, smaller global batch of ``tail``
        samples (the epoch's by default; none for a rank past its end)."""
        plan = self.plan
        rows = len(range(plan.rank, self.tail if tail is None else tail, plan.world_size))
        return [min(plan.micro_batch, rows - i) for i in range(0, rows, plan.micro_batch)]

    def __len__(self) -> int:
        return self.full_steps * self.plan.micro_batches + len(self.tail_sizes())

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, consumed: int) -> None:
        self._first = int(consumed) // self.unit * self.plan.global_batch

    def resume_at_position(self, batches: int, offset: int) -> None:
        """Start the next pass ``batches`` global batches and ``offset`` samples into the epoch
        (a resume with a new global batch: its sample position, data/world_change.py)."""
        self._first = int(batches) * self.plan.global_batch + int(offset)


class GlobalBatchLoader:
    """Yields one :class:`MicroBatches` per global batch (``grouped``), or, for a fixed-size
    run, a plain batch per full global batch and weighted MicroBatches for the epoch's last,
    smaller one (``weighted_tail``: engine/step.py's WithWeightedTail trains it); ``len()`` is
    global batches per epoch. ``sampler`` is the :class:`GlobalBatchSampler` (for
    DistSamplerSeedHook and resume)."""

    def __init__(self, loader: DataLoader, plan: GlobalBatchPlan, grouped: bool = True) -> None:
        if not isinstance(loader.batch_sampler, GlobalBatchSampler):
            raise TypeError(
                "GlobalBatchLoader needs a DataLoader whose batch_sampler is a "
                "GlobalBatchSampler (see regroup)"
            )
        self.loader, self.plan, self.grouped = loader, plan, grouped
        self.sampler: GlobalBatchSampler = loader.batch_sampler
        self.dataset = loader.dataset
        # a plain batch per step: the batch size the loop counts samples with, as a DataLoader's
        self.batch_size: int | None = None if grouped else plan.micro_batch

    @property
    def weighted_tail(self) -> bool:
        """Whether a pass's last, smaller global batch comes as weighted MicroBatches in a run
        whose other steps are plain batches (engine/step_choice.py reads it): the epoch's, or
        the resumed pass's."""
        sampler = self.sampler
        return not self.grouped and (sampler.tail > 0 or sampler.layout(sampler.next_first)[1] > 0)

    def __len__(self) -> int:
        return self.sampler.steps

    def __iter__(self) -> Iterator[Any]:
        sampler, count = self.sampler, self.plan.micro_batches
        full, tail = sampler.layout(sampler.next_first)
        batches = iter(self.loader)
        last = None  # the batch a padding pass repeats (weight 0: it trains nothing)
        for _ in range(full):
            group = list(islice(batches, count))
            last = group[-1]
            yield MicroBatches(group) if self.grouped else group[0]
        if tail:
            yield self._tail_step(list(batches), last, tail)

    def _tail_step(self, parts: list, last: Any, tail: int) -> MicroBatches:
        """This rank's share of a pass's last global batch of ``tail`` samples
        (global_batch.tail_step), padded with its own last batch again (none decoded twice),
        or, with no batch of this pass yet (a resume at the tail) and no sample in the tail,
        one sample of its own read for it."""

        def pad() -> Any:
            if parts or last is not None:
                return parts[-1] if parts else last
            first = self.sampler.order()[self.plan.rank]
            return self.loader.collate_fn([self.dataset[first]])

        return tail_step(parts, self.sampler.tail_sizes(tail), self.plan, tail, pad)


def regroup(loader: Any, plan: GlobalBatchPlan, grouped: bool = True) -> GlobalBatchLoader:
    """``loader`` (built from ``train_dataloader``) re-cut into global batches: the same
    dataset, collate function, workers and generator; a :class:`GlobalBatchSampler` in place of
    its ``DefaultSampler``. ``grouped=False``: plain batches (one micro-batch a step), see
    :func:`exact_epochs`."""
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
        drop_last=loader.drop_last,
        unit=1 if grouped else plan.micro_batch,
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
    return GlobalBatchLoader(
        DataLoader(loader.dataset, batch_sampler=batches, **args), plan, grouped
    )


def exact_epochs(
    loader: Any, world_size: int, rank: int, trains_itself: bool, logger: logging.Logger
) -> Any:
    """A fixed-size run's ``DefaultSampler`` DataLoader on several ranks whose data set they
    cannot split evenly, re-cut so that an epoch trains every sample once: ``DefaultSampler``
    (like torch's ``DistributedSampler`` and MMEngine's) pads the epoch with its first samples
    to a multiple of the ranks, so up to ``w - 1`` of them trained twice an epoch. The full
    global batches are the same ones, each rank's the same samples; the last, smaller one is
    trained as weighted MicroBatches (:class:`GlobalBatchSampler`). ``loader`` as it is
    otherwise, and for a model with its own ``train_step`` (one batch per call: it cannot
    weight the ranks' unequal shares), which keeps the padding, as MMEngine does."""
    sampler = getattr(loader, "sampler", None)
    if (
        world_size == 1
        or not isinstance(loader, DataLoader)
        or not isinstance(sampler, DefaultSampler)
        or not isinstance(loader.batch_size, int)
    ):
        return loader
    samples = len(sampler.dataset)  # DefaultSampler's data set is Sized; the loader's the same
    if samples % world_size == 0:
        return loader
    if trains_itself:
        logger.info(
            "train_dataloader: the model's own train_step trains one batch per call, so "
            "DefaultSampler pads each epoch's %d samples to a multiple of %d ranks as MMEngine "
            "does (%d of them trained twice)",
            samples,
            world_size,
            -samples % world_size,
        )
        return loader
    plan = GlobalBatchPlan(loader.batch_size * world_size, world_size, rank, loader.batch_size, 1)
    return regroup(loader, plan, grouped=False)


def elastic_training(
    loader: Any,
    optim_wrapper: Any,
    launcher: Any,
    world_size: int,
    rank: int,
    resumed: dict | None = None,
    logger: logging.Logger | None = None,
    trains_itself: bool = False,
) -> tuple[Any, Any, GlobalBatchPlan | None]:
    """The train loader and optim_wrapper config as the run uses them, and the plan: an elastic
    run's (re-cut into global batches; accumulation done by the step, engine/step.py's
    ElasticStep), or a fixed-size run's resumed at another world size (``resumed``: the
    checkpoint's meta; its global batch is kept, see :mod:`.world_change`); otherwise no plan,
    and the loader as it is or re-cut to train every sample once an epoch (:func:`exact_epochs`;
    ``trains_itself``: the model has its own ``train_step``)."""
    sizes = elastic_range(launcher)
    log = logger or logging.getLogger(__name__)
    kept_stream_count(loader, sizes or (world_size, world_size), resumed or {})
    if sizes is None:
        plan = kept_global_batch(loader, world_size, rank, resumed or {}, log)
        if plan is None:
            return exact_epochs(loader, world_size, rank, trains_itself, log), optim_wrapper, None
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
    saved = (resumed or {}).get("global_batch")
    if saved and int(saved) != global_batch:  # batch_size or accumulation edited for the resume
        new_global_batch(global_batch, world_size, resumed or {}, log)
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
