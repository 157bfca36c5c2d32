"""OptimWrapper: one object that does backward, accumulation, clipping, AMP and the step.

``optim_wrapper=dict(type='OptimWrapper', optimizer=dict(type='SGD', lr=0.1),
accumulative_counts=4, clip_grad=dict(max_norm=1.0))``; ``type='AmpOptimWrapper',
dtype='bfloat16'`` (or ``'float16'``, which adds a GradScaler) for mixed precision.

Gradient accumulation scales each loss by ``1/accumulative_counts`` and steps every
``accumulative_counts`` updates. When the run's iteration count is not a multiple of it, the last,
shorter window is scaled by its own length so its gradient is still a mean. Inside DDP the
non-stepping backward passes run under ``no_sync()`` so gradients are all-reduced once per step.

The training loop does not always call :meth:`OptimWrapper.update_params`: when
:meth:`OptimWrapper.is_plain` (one update per step, no clipping, nothing overridden) it steps the
optimizer itself (``distributed_runner/engine/step.py``, the plain step), which is the same update.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from distributed_runner.core import dist
from distributed_runner.core.config_values import positive_int
from distributed_runner.core.errors import ConfigError
from distributed_runner.core.registry import OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS, OPTIMIZERS
from distributed_runner.core.signatures import check_arguments
from distributed_runner.model.sharding import like_param, local_tensor
from distributed_runner.parallel.grad_norm import clip_grad_norm

NO_CONTEXT = contextlib.nullcontext()  # reusable: entering it does nothing


@OPTIM_WRAPPERS.register_module()
class OptimWrapper:
    """Backward + (accumulated) step + optional gradient clipping around a torch optimizer."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        accumulative_counts: int = 1,
        clip_grad: dict | None = None,
    ) -> None:
        """Args:
        accumulative_counts (int): micro-batches whose gradients add up to one optimizer
            step (gradient accumulation).
        clip_grad (dict | None): ``dict(max_norm=...)`` (``torch.nn.utils.clip_grad_norm_``'s
            arguments) to clip the gradients' norm before each step.
        """
        positive_int(
            {"accumulative_counts": accumulative_counts}, "accumulative_counts", "optim_wrapper"
        )  # the config's rule, also for a wrapper built in Python
        self.optimizer = optimizer
        self.accumulative_counts = int(accumulative_counts)
        self.clip_grad = dict(clip_grad) if clip_grad else None
        if self.clip_grad is not None and "max_norm" not in self.clip_grad:
            raise ConfigError(
                "optim_wrapper.clip_grad", "needs max_norm, e.g. clip_grad=dict(max_norm=1.0)"
            )
        self._inner_count = 0
        self._max_counts = 0
        self._remainder = 0
        self.last_grad_norm: torch.Tensor | None = None
        self._averaging = False  # inside averaging_gradients(): each step averages over ranks

    def is_plain(self) -> bool:
        """Whether an update is exactly ``loss.backward(); optimizer.step();
        optimizer.zero_grad(set_to_none=True)`` with no context around the forward pass: one
        update per step, no clipping, no averaging, and none of the methods an update goes
        through overridden. The training step asks once per run; when True it calls the torch
        optimizer itself (engine/step.py's plain step), the cheapest iteration. (The update counter
        is then not advanced: with one update per step no decision reads it.)"""
        cls = type(self)
        return (
            self.accumulative_counts == 1
            and self.clip_grad is None
            and not self._averaging
            and all(
                getattr(cls, name) is getattr(OptimWrapper, name)
                for name in ("update_params", "backward", "step", "zero_grad", "optim_context")
            )
        )

    # -- accumulation bookkeeping ----------------------------------------------------------------
    def initialize_count_status(self, done: int, max_counts: int) -> None:
        """Tell the wrapper how many updates happened (resume) and how many there will be."""
        self._inner_count = int(done)
        self._max_counts = int(max_counts)
        self._remainder = self._max_counts % self.accumulative_counts

    def _steps_after(self, count: int) -> bool:
        return count % self.accumulative_counts == 0 or count == self._max_counts

    def should_update(self) -> bool:
        """Whether the update in progress (the next ``update_params``) ends with a step."""
        return self._steps_after(self._inner_count + 1)

    def _loss_factor(self) -> int:
        if self.accumulative_counts == 1:
            return 1
        if self._remainder and self._inner_count >= self._max_counts - self._remainder:
            return self._remainder
        return self.accumulative_counts

    # -- the update --------------------------------------------------------------------------
    def optim_context(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Run the forward pass under this: it skips DDP's gradient all-reduce on accumulating
        passes (and enables autocast in :class:`AmpOptimWrapper`)."""
        if self.accumulative_counts > 1 and not self.should_update():
            no_sync = getattr(model, "no_sync", None)  # DDP's
            if no_sync is not None:
                return no_sync()
        # FSDP2 has no no_sync: its gradients are reduce-scattered on every pass, so they stay
        # sharded in p.grad, where a checkpoint inside an accumulation window finds them
        # (set_requires_gradient_sync(False) would hold them in FSDP's private buffers instead)
        return NO_CONTEXT

    @contextlib.contextmanager
    def micro_batch_context(self, model: nn.Module, sync: bool) -> Iterator[None]:
        """The forward context of one micro-batch of an elastic global batch (engine/step.py's
        ElasticStep): DDP skips its all-reduce unless ``sync`` (the last), plus
        :meth:`optim_context`'s."""
        no_sync = None if sync else getattr(model, "no_sync", None)
        with no_sync() if no_sync is not None else NO_CONTEXT, self.optim_context(model):
            yield

    @contextlib.contextmanager
    def averaging_gradients(self) -> Iterator[None]:
        """Inside it, every optimizer step first replaces each gradient by its mean over the
        ranks. For a model whose own ``train_step`` calls its module, not the DDP wrapper: DDP
        then cannot all-reduce the gradients, so this does (one all-reduce per dtype and device
        per step, after backward, not overlapped with it)."""
        before, self._averaging = self._averaging, True
        try:
            yield
        finally:
            self._averaging = before

    def _average_gradients(self) -> None:
        groups: dict[tuple, list[torch.Tensor]] = {}
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
        for grads in groups.values():  # flattened together: one all-reduce for all of them
            flat = dist.all_reduce(torch.cat([g.reshape(-1) for g in grads]), "mean")
            for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                g.copy_(part.view_as(g))

    def update_params(self, loss: torch.Tensor) -> None:
        """Backward (the loss scaled for accumulation), and at a window's end the step."""
        self.accumulate(loss)
        self._inner_count += 1
        if self._steps_after(self._inner_count):
            self.step()
            self.zero_grad()

    def accumulate(self, loss: torch.Tensor) -> None:
        """Backward of one micro-batch of the update in progress (engine/step.py's ElasticStep:
        all but the last of a global batch's), its loss scaled for accumulation as
        :meth:`update_params` scales its own; nothing counted, no step."""
        factor = self._loss_factor()
        self.backward(loss / factor if factor != 1 else loss)

    def skip_update(self) -> None:
        """Count this iteration but drop its update (a rejected step): no backward, no step, and
        the gradients accumulated so far in this window are discarded."""
        self._inner_count += 1
        self.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _clip(self, clip_grad: dict) -> None:
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        if params:
            # sharded gradients (FSDP; under TP on two meshes) give the whole norm, for the logs
            self.last_grad_norm = clip_grad_norm(params, **clip_grad)

    def step(self) -> None:
        if self._averaging:
            self._average_gradients()
        if self.clip_grad is not None:
            self._clip(self.clip_grad)
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    # -- state ---------------------------------------------------------------------------------
    def pending_grads(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """Gradients accumulated since the last step (None at a window boundary).

        A checkpoint taken inside an accumulation window must carry them, or a resumed run would
        step with part of the window's gradient missing.
        """
        if self._inner_count % self.accumulative_counts == 0:
            return None
        return {
            n: local_tensor(p.grad.detach()).cpu().clone()
            for n, p in model.named_parameters()
            if p.grad is not None
        }

    def restore_pending_grads(self, model: nn.Module, grads: dict[str, torch.Tensor]) -> list[str]:
        """Give back a window's gradients (this rank's parts). When any is shaped unlike this
        rank's part of its parameter (saved under another strategy or mesh) none is restored,
        and the names that do not fit are returned."""
        params = dict(model.named_parameters())
        misfits = [
            n for n, g in grads.items() if n in params and g.shape != local_tensor(params[n]).shape
        ]
        if misfits:
            return misfits
        for n, p in params.items():
            if n in grads:
                p.grad = like_param(grads[n].clone(), p)
        return []

    @property
    def param_groups(self) -> list[dict]:
        return self.optimizer.param_groups

    def get_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)

    def scaler_state_dict(self) -> dict | None:
        return None

    def load_scaler_state_dict(self, state: dict | None) -> None:
        """No scaler: nothing to restore."""


@OPTIM_WRAPPERS.register_module()
class AmpOptimWrapper(OptimWrapper):
    """Mixed precision: autocast in ``optim_context``; fp16 adds a GradScaler (bf16 needs none)."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        dtype: str = "float16",
        loss_scale: str | float = "dynamic",
        device_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(optimizer, **kwargs)
        dtypes = {
            "float16": torch.float16,
            "fp16": torch.float16,
            "half": torch.float16,
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
        }
        if dtype not in dtypes:
            raise ConfigError(
                "optim_wrapper.dtype", f"unknown dtype {dtype!r}: use 'float16' or 'bfloat16'"
            )
        self.dtype = dtypes[dtype]
        self.device_type = device_type or self._param_device_type()
        self.scaler: torch.amp.GradScaler | None = None
        if self.dtype is torch.float16:
            scale_args: dict = {}
            if loss_scale != "dynamic":
                scale_args = {"init_scale": float(loss_scale), "growth_interval": 2**31 - 1}
            self.scaler = torch.amp.GradScaler(self.device_type, **scale_args)

    def _param_device_type(self) -> str:
        for g in self.optimizer.param_groups:
            for p in g["params"]:
                return p.device.type
        return "cpu"

    @contextlib.contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        with super().optim_context(model), torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self) -> None:
        if self.scaler is None:
            return super().step()
        if self._averaging:
            self._average_gradients()
        if self.clip_grad is not None:
            self.scaler.unscale_(self.optimizer)
            self._clip(self.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def scaler_state_dict(self) -> dict | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_scaler_state_dict(self, state: dict | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


def build_optim_wrapper(
    spec: Any, model: nn.Module, key: str = "optim_wrapper", params: Any = None
) -> OptimWrapper:
    """An OptimWrapper from ``dict(type=..., optimizer=dict(type='SGD', lr=...), ...)``, over
    ``params`` (default: all of the model's); ``paramwise_cfg`` or ``constructor`` hand the
    spec to an optimizer constructor (:func:`constructor_for`)."""
    if isinstance(spec, OptimWrapper):
        return spec
    if isinstance(spec, torch.optim.Optimizer):
        return OptimWrapper(spec)
    if not isinstance(spec, dict):
        raise ConfigError(key, "expected dict(optimizer=dict(type='SGD', lr=0.01), ...)")
    if "paramwise_cfg" in spec or "constructor" in spec:
        return constructor_for(spec, key)(model)
    args = dict(spec)
    wrapper_cls = OPTIM_WRAPPERS.resolve(args.pop("type", "OptimWrapper"), key)
    opt_spec = args.pop("optimizer", None)
    if opt_spec is None:
        raise ConfigError(f"{key}.optimizer", "missing: add optimizer=dict(type='SGD', lr=0.01)")
    if isinstance(opt_spec, torch.optim.Optimizer):
        optimizer = opt_spec
    else:
        if not isinstance(opt_spec, dict) or "type" not in opt_spec:
            raise ConfigError(f"{key}.optimizer", "needs type=, e.g. dict(type='AdamW', lr=1e-3)")
        opt_args = {k: v for k, v in opt_spec.items() if k != "type"}
        opt_cls = OPTIMIZERS.resolve(opt_spec["type"], f"{key}.optimizer")
        check_arguments(opt_cls, opt_args, f"{key}.optimizer", supplied=["params"])
        optimizer = opt_cls(model.parameters() if params is None else params, **opt_args)
    check_arguments(wrapper_cls, args, key, supplied=["optimizer"])
    return wrapper_cls(optimizer=optimizer, **args)


def constructor_for(spec: dict, key: str = "optim_wrapper") -> Any:
    """The optimizer constructor ``spec`` names (``constructor='Name'``, MMEngine's key; default
    ``DefaultOptimWrapperConstructor``), built with the rest of ``spec`` and its
    ``paramwise_cfg``, which checks them without a model.

    Found in OPTIM_WRAPPER_CONSTRUCTORS, whose first look-up imports the built-in constructors
    (:mod:`distributed_runner.optim.constructor`): so this module never imports that one, which
    imports this one."""
    args = dict(spec)
    name = args.pop("constructor", "DefaultOptimWrapperConstructor")
    paramwise = args.pop("paramwise_cfg", None)
    try:
        cls = OPTIM_WRAPPER_CONSTRUCTORS.resolve(name, f"{key}.constructor")
    except ConfigError as e:  # MMEngine's key is a plain name: report it, not '.type'
        raise ConfigError(f"{key}.constructor", e.message) from None
    return cls(args, paramwise)
