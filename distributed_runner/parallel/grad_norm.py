"""Gradient clipping when parameters live on different meshes.

Under FSDP x TP a split layer's weight is a DTensor on the 2-D ``(dp_shard, tp)`` mesh while a
norm's weight (not in the plan) is sharded on ``dp_shard`` only. ``torch.nn.utils.
clip_grad_norm_`` stacks every parameter's norm into one tensor, which DTensor refuses across
meshes. Here each mesh's norm is computed by torch as usual, made whole (one reduction per
mesh), and the per-mesh norms combine into the total that scales every gradient. Under
pipeline parallelism the stages' norms combine over the pipeline's ranks the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from distributed_runner.core import dist


def meshes_of(params: Iterable[torch.Tensor]) -> dict[object, list[torch.Tensor]]:
    """The parameters grouped by their gradient's device mesh (None: plain tensors)."""
    groups: dict[object, list[torch.Tensor]] = {}
    for param in params:
        if param.grad is not None:
            groups.setdefault(getattr(param.grad, "device_mesh", None), []).append(param)
    return groups


def clip_grad_norm(
    params: list[torch.Tensor],
    max_norm: float,
    norm_type: float = 2.0,
    error_if_nonfinite: bool = False,
    foreach: bool | None = None,
) -> torch.Tensor:
    """``clip_grad_norm_`` over parameters on any number of meshes, and over a pipeline's
    stages; returns the total norm as a plain tensor (the same on every rank). Without tensor
    or pipeline parallelism every gradient is on one mesh (or none): torch's own call, with no
    per-step grouping on the hot path."""
    stages = dist.get_pipeline_size() > 1
    groups = meshes_of(params) if dist.get_tensor_parallel_size() > 1 or stages else {}
    if len(groups) <= 1 and not stages:
        norm = nn.utils.clip_grad_norm_(
            params, max_norm, norm_type, error_if_nonfinite=error_if_nonfinite, foreach=foreach
        )
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    from torch.distributed.tensor.experimental import implicit_replication

    norms = []
    for group in groups.values():
        grads = [grad for p in group if (grad := p.grad) is not None]  # all, by meshes_of
        norm = nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite, foreach)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
    if stages:
        total = _over_stages(total, norm_type)
    with implicit_replication():  # the plain total scales DTensor gradients as it is
        for group in groups.values():
            nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach)
    return total


def _over_stages(norm: torch.Tensor, norm_type: float) -> torch.Tensor:
    """Pipeline parallelism: each rank holds its stages' parameters, so their norms combine
    over the pipeline's ranks (the p-th powers summed, or the maximum) before any gradient is
    scaled: every stage clips by the whole model's norm, as one process would."""
    import torch.distributed as torch_dist

    group = dist.get_pipeline_group()
    if norm_type == float("inf"):
        torch_dist.all_reduce(norm, torch_dist.ReduceOp.MAX, group=group)
        return norm
    power = norm.double() ** norm_type
    torch_dist.all_reduce(power, group=group)
    return (power ** (1.0 / norm_type)).to(norm.dtype)
