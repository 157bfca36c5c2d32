"""Tensors that may be sharded (DTensors: FSDP2's parameters and their optimizer state) read and
written as plain ones: this rank's part, the whole of one, a whole one cut like another."""

from __future__ import annotations

import torch


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded tensor (a DTensor); a plain tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def like_param(local: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``local`` (this rank's part) as a tensor shaped and placed like ``param``."""
    mesh, placements = getattr(param, "device_mesh", None), getattr(param, "placements", None)
    if mesh is not None:  # a DTensor (FSDP2's parameter)
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(
            local.to(param.device, param.dtype),
            mesh,
            placements,
            run_check=False,
            shape=param.shape,
            stride=param.stride(),
        )
    return local.to(param.device, param.dtype)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """All of a sharded tensor, gathered (a collective); a plain tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def shard_like(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``full`` (the same on every rank) cut into ``like``'s shards, with no communication."""
    full = full.to(like.device, like.dtype)
    mesh, placements = getattr(like, "device_mesh", None), getattr(like, "placements", None)
    if mesh is not None:  # a DTensor (FSDP2's parameter)
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full, mesh, placements, src_data_rank=None)
    return full
