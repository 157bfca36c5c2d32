"""The global batch of an elastic group and how one rank takes its share of it (see
:mod:`.elastic` for the rule): shared by the map-style path (``elastic.GlobalBatchSampler``) and
the streamed one (``streaming.StreamingLoader``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GlobalBatchPlan:
    """How one rank takes its share of each global batch at this world size."""

    global_batch: int
    world_size: int
    rank: int
    micro_batch: int  # samples per forward pass
    micro_batches: int  # forward passes per rank per step

    @classmethod
    def build(
        cls, global_batch: int, batch_size: int, world_size: int, rank: int
    ) -> GlobalBatchPlan:
        share = global_batch // world_size
        count = -(-share // batch_size)  # the fewest passes of at most batch_size samples...
        while share % count:  # ...that split the share evenly
            count += 1
        return cls(global_batch, world_size, rank, share // count, count)

    def describe(self) -> str:
        return (
            f"global batch {self.global_batch} = {self.world_size} workers x "
            f"{self.micro_batches} micro-batches x {self.micro_batch} samples"
        )


class MicroBatches(list):
    """One rank's share of one global batch: engine/step.py's ElasticStep trains it as one step."""
