"""Optimizer constructors: per-parameter groups from ``paramwise_cfg``, as MMEngine builds them.

``optim_wrapper=dict(optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0,
custom_keys={'backbone': dict(lr_mult=0.1)}))`` — in nearly every OpenMMLab config. Without
``paramwise_cfg`` every parameter is in one group. With it, each trainable parameter gets a group
of its own, visited module by module in ``named_children`` order, with these rules:

* ``custom_keys``: the longest key (ties: the alphabetically first) that is a substring of the
  parameter's full name wins, and the rules below are skipped for it. Its group has ``lr = lr x
  lr_mult``, ``weight_decay = weight_decay x decay_mult`` (when the optimizer has a weight
  decay), and every item of the key's dict copied in as is (``lr_mult`` too, and any optimizer
  option such as ``betas``).
* otherwise ``bias_lr_mult`` scales the lr of every ``bias`` outside normalization layers;
  ``dcn_offset_lr_mult`` scales the lr of ``conv_offset`` convolutions inside deformable
  convolutions. Then one weight-decay rule, the first that applies: ``norm_decay_mult`` for
  BatchNorm/InstanceNorm/GroupNorm/LayerNorm parameters, ``bias_decay_mult`` for biases,
  ``dwconv_decay_mult`` for depthwise ``Conv2d`` (``in_channels == groups``), ``flat_decay_mult``
  for any other 1-D parameter.
* parameters with ``requires_grad=False`` are left out; ``bypass_duplicate=True`` leaves out a
  parameter already in an earlier group (shared weights) instead of failing in the optimizer.

These are MMEngine's ``DefaultOptimWrapperConstructor`` rules (a test checks our groups against
the published MMEngine constructor's); unlike MMEngine, a misspelled option is an error, not
ignored. ``constructor='Name'`` picks another registered constructor: a subclass that overrides
``add_params(params, module, prefix, is_dcn_module)`` (as downstream projects' layer-decay
constructors do) keeps the same attributes (``base_lr``, ``base_wd``, ``paramwise_cfg``,
``optimizer_cfg``, ``optim_wrapper_cfg``).

Imports go one way: this module imports :mod:`distributed_runner.optim.wrapper`, never the reverse.
:func:`~distributed_runner.optim.wrapper.build_optim_wrapper` finds a constructor through the
OPTIM_WRAPPER_CONSTRUCTORS registry (:func:`~distributed_runner.optim.wrapper.constructor_for`),
whose first look-up imports this module.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from distributed_runner.core.errors import ConfigError, did_you_mean
from distributed_runner.core.log import current_logger
from distributed_runner.core.registry import OPTIM_WRAPPER_CONSTRUCTORS
from distributed_runner.model.build import is_model_wrapper
from distributed_runner.optim.wrapper import OptimWrapper, build_optim_wrapper

PARAMWISE_OPTIONS = (
    "custom_keys",
    "bias_lr_mult",
    "bias_decay_mult",
    "norm_decay_mult",
    "dwconv_decay_mult",
    "flat_decay_mult",
    "dcn_offset_lr_mult",
    "bypass_duplicate",
)
# the multipliers MMEngine refuses without a weight decay to scale (flat_decay_mult it ignores)
DECAY_OPTIONS = ("bias_decay_mult", "norm_decay_mult", "dwconv_decay_mult")
NORM_LAYERS = (_BatchNorm, _InstanceNorm, nn.GroupNorm, nn.LayerNorm)
KEY = "optim_wrapper.paramwise_cfg"


@functools.cache
def deformable_conv_types() -> tuple[type, ...]:
    """mmcv's deformable convolutions, when mmcv is installed (``dcn_offset_lr_mult``); looked
    up once (a failed import is not cached by Python, and add_params asks for every module)."""
    try:
        from mmcv.ops import DeformConv2d, ModulatedDeformConv2d
    except Exception:  # noqa: BLE001 - no mmcv (or no compiled ops): no deformable convs
        return ()
    return (DeformConv2d, ModulatedDeformConv2d)


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class DefaultOptimWrapperConstructor:
    """Builds the OptimWrapper, its optimizer over per-parameter groups (see the module doc)."""

    def __init__(self, optim_wrapper_cfg: dict, paramwise_cfg: dict | None = None) -> None:
        if not isinstance(optim_wrapper_cfg, dict) or "optimizer" not in optim_wrapper_cfg:
            raise ConfigError("optim_wrapper", "needs optimizer=dict(type=..., lr=...)")
        self.optim_wrapper_cfg = dict(optim_wrapper_cfg)
        self.optimizer_cfg = self.optim_wrapper_cfg.pop("optimizer")
        self.paramwise_cfg = {} if paramwise_cfg is None else paramwise_cfg
        optimizer = self.optimizer_cfg if isinstance(self.optimizer_cfg, dict) else {}
        self.base_lr = optimizer.get("lr")
        self.base_wd = optimizer.get("weight_decay")
        self._validate()

    def _validate(self) -> None:
        cfg = self.paramwise_cfg
        if not isinstance(cfg, dict):
            raise ConfigError(KEY, f"expected a dict, got {type(cfg).__name__}")
        if type(self) is DefaultOptimWrapperConstructor:  # subclasses may read options of theirs
            for option in cfg:
                if option not in PARAMWISE_OPTIONS:
                    hint = did_you_mean(option, PARAMWISE_OPTIONS)
                    raise ConfigError(
                        f"{KEY}.{option}",
                        f"unknown option{hint}; takes {', '.join(PARAMWISE_OPTIONS)}",
                    )
        custom = cfg.get("custom_keys", {})
        if not isinstance(custom, dict) or not all(isinstance(v, dict) for v in custom.values()):
            raise ConfigError(
                f"{KEY}.custom_keys", "expected {'name part': dict(lr_mult=..., decay_mult=...)}"
            )
        wants_decay = [
            f"custom_keys.{k}.decay_mult" for k, v in custom.items() if "decay_mult" in v
        ] + [o for o in DECAY_OPTIONS if o in cfg]
        if wants_decay and self.base_wd is None:
            raise ConfigError(
                f"{KEY}.{wants_decay[0]}",
                "scales the weight decay, but "
                "optim_wrapper.optimizer sets none: "
                "add weight_decay=...",
            )
        if (
            custom or "bias_lr_mult" in cfg or "dcn_offset_lr_mult" in cfg
        ) and self.base_lr is None:
            raise ConfigError(
                "optim_wrapper.optimizer.lr", "paramwise_cfg scales the learning rate: set lr=..."
            )

    # -- the groups ----------------------------------------------------------------------------
    def add_params(
        self, params: list[dict], module: nn.Module, prefix: str = "", is_dcn_module: Any = None
    ) -> None:
        """Append a group for each of ``module``'s own parameters, then recurse into its
        children (``is_dcn_module``: whether ``module``'s parent is a deformable conv)."""
        cfg = self.paramwise_cfg
        custom = cfg.get("custom_keys", {})
        keys = sorted(sorted(custom), key=len, reverse=True)  # longest first, then alphabetical
        is_norm = isinstance(module, NORM_LAYERS)
        is_dwconv = isinstance(module, nn.Conv2d) and module.in_channels == module.groups
        logger = current_logger()
        for name, param in module.named_parameters(recurse=False):
            full_name = f"{prefix}.{name}" if prefix else name
            if cfg.get("bypass_duplicate", False) and any(
                p is param for group in params for p in group["params"]
            ):
                logger.warning(
                    "%s is shared with an earlier group: left out (bypass_duplicate=True)",
                    full_name,
                )
                continue
            if not param.requires_grad:
                logger.info("%s is left out of the optimizer (requires_grad=False)", full_name)
                continue
            group: dict[str, Any] = {"params": [param]}
            key = next((k for k in keys if k in f"{prefix}.{name}"), None)
            if key is not None:
                group["lr"] = self.base_lr * custom[key].get("lr_mult", 1.0)
                if self.base_wd is not None:
                    group["weight_decay"] = self.base_wd * custom[key].get("decay_mult", 1.0)
                group.update(custom[key])
            else:
                self._apply_rules(
                    group, name, param, module, prefix, is_norm, is_dwconv, is_dcn_module
                )
            params.append(group)
            for option, value in group.items():
                if option != "params":
                    logger.debug("paramwise_cfg: %s %s=%s", full_name, option, value)
        dcn_types = deformable_conv_types()
        is_dcn = bool(dcn_types) and isinstance(module, dcn_types)
        for child_name, child in module.named_children():
            self.add_params(
                params,
                child,
                f"{prefix}.{child_name}" if prefix else child_name,
                is_dcn_module=is_dcn,
            )

    def _apply_rules(
        self,
        group: dict,
        name: str,
        param: torch.Tensor,
        module: nn.Module,
        prefix: str,
        is_norm: bool,
        is_dwconv: bool,
        is_dcn_module: Any,
    ) -> None:
        cfg, base_lr, base_wd = self.paramwise_cfg, self.base_lr, self.base_wd
        if name == "bias" and not (is_norm or is_dcn_module) and "bias_lr_mult" in cfg:
            group["lr"] = base_lr * cfg["bias_lr_mult"]
        if (
            "conv_offset" in prefix
            and is_dcn_module
            and "dcn_offset_lr_mult" in cfg
            and isinstance(module, nn.Conv2d)
        ):
            group["lr"] = base_lr * cfg["dcn_offset_lr_mult"]
        if base_wd is None:
            return
        if is_norm and "norm_decay_mult" in cfg:
            group["weight_decay"] = base_wd * cfg["norm_decay_mult"]
        elif name == "bias" and not is_dcn_module and "bias_decay_mult" in cfg:
            group["weight_decay"] = base_wd * cfg["bias_decay_mult"]
        elif is_dwconv and "dwconv_decay_mult" in cfg:
            group["weight_decay"] = base_wd * cfg["dwconv_decay_mult"]
        elif param.ndim == 1 and not is_dcn_module and "flat_decay_mult" in cfg:
            group["weight_decay"] = base_wd * cfg["flat_decay_mult"]

    def __call__(self, model: nn.Module) -> OptimWrapper:
        if is_model_wrapper(model):  # nn.Module's attributes are typed Tensor | Module
            model = cast(nn.Module, model.module)
        params: Any = model.parameters()
        if self.paramwise_cfg:
            params = []
            self.add_params(params, model)
            _check_shared(params, model)
        return build_optim_wrapper(
            {**self.optim_wrapper_cfg, "optimizer": self.optimizer_cfg}, model, params=params
        )


def _check_shared(groups: list[dict], model: nn.Module) -> None:
    """One line for a parameter in two groups (tied weights), which torch's optimizers refuse
    with a traceback."""
    seen: set[int] = set()
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    for group in groups:
        for param in group["params"]:
            if id(param) in seen:
                raise ConfigError(
                    f"{KEY}.bypass_duplicate",
                    f"parameter {names.get(id(param))} "
                    f"is shared with another module "
                    f"(tied weights): set "
                    f"bypass_duplicate=True",
                )
            seen.add(id(param))
