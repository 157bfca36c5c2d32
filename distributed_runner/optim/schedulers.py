"""Parameter schedulers: torch's LR schedulers, active over ``[begin, end)`` by epoch or by iter.

``param_scheduler=[dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=100),
dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=20, convert_to_iter_based=True)]``

Any ``torch.optim.lr_scheduler`` class works by name. Each scheduler only steps while the run is
inside its window, so chains (warmup, then cosine) need no ``SequentialLR``. Where a torch argument
is a length (``T_max``, ``total_iters``) and the config leaves it out, it defaults to the window
``end - begin``. ``convert_to_iter_based=True`` turns an epoch schedule into the same curve stepped
every iteration (smooth warmups and cosines) by multiplying its epoch-valued arguments by the
epoch length.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import PARAM_SCHEDULERS
from distributed_runner.core.signatures import accepts, check_arguments

# torch arguments measured in scheduler steps, converted with convert_to_iter_based
_LENGTH_ARGS = ("T_max", "total_iters", "step_size", "T_0")
_WINDOW_DEFAULTS = ("T_max", "total_iters")

# Schedulers step per iteration; with gradient accumulation the first iterations have no optimizer
# step yet, which makes torch warn about an ordering that is intended here.
warnings.filterwarnings(
    "ignore",
    message=r"Detected call of `lr_scheduler\.step\(\)` before "
    r"`optimizer\.step\(\)`",
)


class ParamScheduler:
    """A torch scheduler plus when it is active; ``step()`` is called once per epoch or per iter."""

    def __init__(self, scheduler: Any, by_epoch: bool, begin: int, end: float) -> None:
        self.scheduler = scheduler
        self.by_epoch = by_epoch
        self.begin = begin
        self.end = end
        self.last_step = 0

    def step(self) -> None:
        self.last_step += 1
        if self.begin < self.last_step <= self.end:
            self.scheduler.step()

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict:
        return {"scheduler": self.scheduler.state_dict(), "last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.last_step = int(state["last_step"])

    def __repr__(self) -> str:
        unit = "epoch" if self.by_epoch else "iter"
        return f"{type(self.scheduler).__name__}({unit} {self.begin}..{self.end})"


def build_param_schedulers(
    spec: Any,
    optimizer: torch.optim.Optimizer,
    *,
    by_epoch_training: bool,
    epoch_length: int,
    max_epochs: int | None,
    max_iters: int | None,
    key: str = "param_scheduler",
) -> list[ParamScheduler]:
    """Build the list of schedulers for ``optimizer`` from a dict or a list of dicts."""
    if spec is None:
        return []
    specs = spec if isinstance(spec, (list, tuple)) else [spec]
    out = []
    for i, s in enumerate(specs):
        k = f"{key}[{i}]" if isinstance(spec, (list, tuple)) else key
        out.append(
            _build_one(s, optimizer, k, by_epoch_training, epoch_length, max_epochs, max_iters)
        )
    return out


def _build_one(spec: Any, optimizer, key, by_epoch_training, epoch_length, max_epochs, max_iters):
    if isinstance(spec, ParamScheduler):
        return spec
    if not isinstance(spec, dict) or "type" not in spec:
        raise ConfigError(key, "expected dict(type='CosineAnnealingLR', ...)")
    args = {k: v for k, v in spec.items() if k != "type"}
    cls = PARAM_SCHEDULERS.resolve(spec["type"], key)
    by_epoch = bool(args.pop("by_epoch", True))
    begin = int(args.pop("begin", 0))
    end = args.pop("end", None)
    if args.pop("convert_to_iter_based", False) and by_epoch:
        if epoch_length <= 0:
            raise ConfigError(
                f"{key}.convert_to_iter_based", "needs a train_dataloader with a known length"
            )
        begin *= epoch_length
        end = None if end is None else int(end) * epoch_length
        for name in _LENGTH_ARGS:
            if name in args:
                args[name] = int(args[name]) * epoch_length
        if "milestones" in args:
            args["milestones"] = [int(m) * epoch_length for m in args["milestones"]]
        by_epoch = False
    if by_epoch and not by_epoch_training:
        raise ConfigError(
            f"{key}.by_epoch",
            "is True but training is iteration-based: set "
            "by_epoch=False (and begin/end in iterations)",
        )
    horizon = max_epochs if by_epoch else max_iters
    end = int(end) if end is not None else (horizon if horizon is not None else math.inf)
    if end <= begin:
        raise ConfigError(f"{key}.end", f"must be greater than begin ({begin})")
    for name in _WINDOW_DEFAULTS:
        if name not in args and accepts(cls, name) and end != math.inf:
            args[name] = int(end - begin)
    check_arguments(cls, args, key, supplied=["optimizer"])
    return ParamScheduler(cls(optimizer, **args), by_epoch, begin, end)
