"""The device mesh a strategy asks for: ``(dp_replicate, dp_shard, tp)`` from the world size.

The order is fixed and ``tp`` is innermost: the ranks of one tensor-parallel group are
consecutive, so on a cluster they are the GPUs of one node (Ray Train gives a node's workers
consecutive ranks) and TP's per-layer collectives stay on the node's fast links, while FSDP's
gathers and reductions cross nodes once per layer.

    world W = dp_replicate R  x  dp_shard S  x  tp T           S = W / (R * T)

    rank = (r * S + s) * T + t     r < R: replica   s < S: shard   t < T: tensor slice
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from distributed_runner.core.errors import ConfigError


@dataclass(frozen=True)
class MeshShape:
    """How many ranks each mesh dimension has; their product is the world size."""

    dp_replicate: int
    dp_shard: int
    tp: int

    @classmethod
    def for_world(cls, world: int, tp: int = 1, dp_replicate: int = 1) -> MeshShape:
        """The mesh of ``world`` ranks with ``tp`` and ``dp_replicate`` as asked; ``dp_shard``
        takes the rest. One-line errors naming the strategy key when they do not divide."""
        if world % tp:
            raise ConfigError(
                "strategy.tp",
                f"{tp} does not divide the world size {world}: use a tp that divides the number "
                f"of workers (ranks of one tensor-parallel group share a node's GPUs)",
            )
        if (world // tp) % dp_replicate:
            raise ConfigError(
                "strategy.dp_replicate",
                f"{dp_replicate} does not divide the {world // tp} data-parallel ranks "
                f"(world {world} / tp {tp})",
            )
        return cls(dp_replicate, world // (tp * dp_replicate), tp)

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def data_parallel(self) -> int:
        """How many model replicas read different data (every rank but tp's)."""
        return self.dp_replicate * self.dp_shard

    def describe(self) -> str:
        """``dp_replicate=1 x dp_shard=2 x tp=2`` for logs and errors."""
        return f"dp_replicate={self.dp_replicate} x dp_shard={self.dp_shard} x tp={self.tp}"


def build_mesh(shape: MeshShape, device_type: str) -> Any:
    """The named 3-D device mesh (every rank calls it: it creates the process groups).

    ``dp_shard`` and ``tp`` are also flattened into one dimension: a gradient norm over a
    parameter sharded on both reduces once over it rather than twice, one dimension after the
    other (which DTensor warns about on every rank)."""
    from torch.distributed.device_mesh import init_device_mesh

    _quiet_redistribute_hints()
    mesh = init_device_mesh(
        device_type,
        (shape.dp_replicate, shape.dp_shard, shape.tp),
        mesh_dim_names=("dp_replicate", "dp_shard", "tp"),
    )
    if shape.tp > 1:
        mesh["dp_shard", "tp"]._flatten("dp_shard_tp")
    return mesh


def data_parallel_mesh(mesh: Any, shape: MeshShape) -> Any:
    """The mesh FSDP2 shards over: ``dp_shard`` alone, or ``(dp_replicate, dp_shard)`` for
    HSDP (replicated across the first, sharded within the second)."""
    if shape.dp_replicate > 1:
        return mesh["dp_replicate", "dp_shard"]
    return mesh["dp_shard"]


class _RedistributeHint(logging.Filter):
    """Drops DTensor's "While redistributing from ... N sequential all_gather operations" hint.

    It is printed by every rank, once per layout, when a 2-D parameter is gathered whole: by a
    full checkpoint, EMA's saved average or an export, never by a training step (whose
    collectives FSDP and the plan choose). A hint about a once-per-checkpoint gather is noise on
    the terminal of every run on a mesh."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("While redistributing from")


def _quiet_redistribute_hints() -> None:
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    if not any(isinstance(f, _RedistributeHint) for f in logger.filters):
        logger.addFilter(_RedistributeHint())
