"""The model a Runner trains: built from its config and, across several ranks, wrapped in DDP.

Kept apart from the Runner so that the next parallel strategies (FSDP) have one place to go.
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from . import dist
from .errors import ConfigError
from .registry import MODELS, accepts, check_arguments


def default_device() -> torch.device:
    """This rank's GPU (the local rank's) when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", dist.get_local_rank())
    return torch.device("cpu")


def build_model(spec: Any, device: torch.device) -> nn.Module:
    """``model=dict(type=...)`` (or a module) on ``device``."""
    built = MODELS.build(spec, "model")
    if not isinstance(built, nn.Module):
        raise ConfigError("model", f"built a {type(built).__name__}, not a torch nn.Module")
    return built.to(device)


def wrap_model(model: nn.Module, wrapper_cfg: dict, device: torch.device) -> nn.Module:
    """DDP when a process group with several ranks is running; the model itself otherwise.

    ``model_wrapper_cfg`` passes DDP arguments. ``broadcast_buffers`` defaults to False (as in
    MMEngine): buffers such as BN statistics stay per rank unless SyncBuffersHook averages
    them, instead of being silently overwritten by rank 0's before every forward.
    """
    if not dist.is_distributed():
        return model
    from torch.nn.parallel import DistributedDataParallel
    if "broadcast_buffers" not in wrapper_cfg:  # its newer name, where torch has it
        key = "forward_sync_buffers" if accepts(DistributedDataParallel,
                                                "forward_sync_buffers") else "broadcast_buffers"
        wrapper_cfg.setdefault(key, False)
    ids = [device.index] if device.type == "cuda" else None
    check_arguments(DistributedDataParallel, wrapper_cfg, "model_wrapper_cfg",
                    supplied=["module"])
    return DistributedDataParallel(model, device_ids=ids, **wrapper_cfg)


def is_model_wrapper(model: Any) -> bool:
    """Whether ``model`` wraps the user's model in ``.module`` (DDP, DataParallel, FSDP1, a
    TTA wrapper): MMEngine's ``mmengine.model.is_model_wrapper``."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel
    wrappers: tuple[type, ...] = (DistributedDataParallel, DataParallel)
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
        wrappers += (FullyShardedDataParallel,)
    except ImportError:  # pragma: no cover - torch built without distributed
        pass
    return isinstance(model, wrappers) or bool(getattr(model, "is_model_wrapper", False))


def get_ori_model(model: nn.Module) -> nn.Module:
    """The user's model inside any wrappers (what downstream hooks call ``get_ori_model``)."""
    while is_model_wrapper(model):
        model = model.module
    return model
