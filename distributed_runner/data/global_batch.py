"""The global batch of an elastic group, or of a run resumed at another world size, and how one
rank takes its share of it (see :mod:`.elastic` for the rule, :mod:`.world_change` for the
resume): shared by the map-style path (``elastic.GlobalBatchSampler``) and the streamed one
(``streaming.StreamingLoader``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GlobalBatchPlan:
    """How one rank takes its share of each global batch at this world size."""

    global_batch: int
    world_size: int
    rank: int
    micro_batch: int  # samples per forward pass
    micro_batches: int  # forward passes per rank per step
    # a resume at another world size (data/world_change.py): the data-parallel ranks of the run
    # whose global batch is kept; None for an elastic group (launcher.num_workers=(min, max))
    kept_from: int | None = None

    @classmethod
    def build(
        cls,
        global_batch: int,
        batch_size: int,
        world_size: int,
        rank: int,
        kept_from: int | None = None,
    ) -> GlobalBatchPlan:
        share = global_batch // world_size
        count = -(-share // batch_size)  # the fewest passes of at most batch_size samples...
        while share % count:  # ...that split the share evenly
            count += 1
        return cls(global_batch, world_size, rank, share // count, count, kept_from)

    def describe(self) -> str:
        kept = (
            f", kept from the checkpoint's {self.kept_from} ranks"
            if self.kept_from is not None
            else ""
        )
        return (
            f"global batch {self.global_batch} = {self.world_size} workers x "
            f"{self.micro_batches} micro-batches x {self.micro_batch} samples{kept}"
        )


class MicroBatches(list):
    """One rank's share of one global batch: engine/step.py's ElasticStep trains it as one step.

    ``weights``: each micro-batch's loss factor, for a share that is not ``c`` equal parts (the
    epoch's last, smaller global batch: see ``streaming.StreamingLoader``); None for ``1 / c``
    each."""

    def __init__(self, batches: Any = (), weights: list[float] | None = None) -> None:
        super().__init__(batches)
        self.weights = weights


def tail_step(
    parts: list, rows: list[int], plan: GlobalBatchPlan, tail: int, pad: Callable[[], Any]
) -> MicroBatches:
    """This rank's share of an epoch's last, smaller global batch of ``tail`` samples (``parts``,
    of ``rows`` samples each) as MicroBatches weighted ``w x rows / tail``, so that the ranks'
    averaged gradient is the mean over the tail's samples; padded to rank 0's count (the largest
    share) with ``pad()``'s batch, weighted 0: every rank makes as many forward passes, as DDP
    and FSDP run collectives in them. Shared by the map-style (elastic.GlobalBatchLoader) and
    the streamed (streaming.StreamingLoader) paths."""
    most = math.ceil(math.ceil(tail / plan.world_size) / plan.micro_batch)
    weights = [plan.world_size * count / tail for count in rows]
    batches = list(parts)
    if len(batches) < most:
        batches += [pad()] * (most - len(batches))
        weights += [0.0] * (most - len(weights))
    return MicroBatches(batches, weights)
