"""What one step does with the user's batch and model (DESIGN §5): move it to the device, call
the model with it, and turn the returned losses into the loss to optimize and the values to log."""
from __future__ import annotations

from typing import Any, Callable

import torch


def move_to(data: Any, device: torch.device) -> Any:
    """Tensors in ``data`` (dicts, lists, tuples) moved to ``device``."""
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, dict):
        return {k: move_to(v, device) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return type(data)(move_to(v, device) for v in data)
    return data


def call_model(model: Any, data: Any, mode: str) -> Any:
    """DESIGN §5: a dict batch is passed as keyword arguments, a tuple/list as positional ones."""
    if isinstance(data, dict):
        return model(**data, mode=mode)
    if isinstance(data, (list, tuple)):
        return model(*data, mode=mode)
    return model(data, mode=mode)


def parse_losses(losses: dict) -> tuple[torch.Tensor, dict]:
    """The sum of every entry whose key contains ``loss``, and all entries detached for logging."""
    if len(losses) == 1 and type(losses) is dict:  # the common case, {'loss': 0-dim tensor}
        value = losses.get("loss")
        if type(value) is torch.Tensor and not value.dim():
            return value, {"loss": value.detach()}
    if not isinstance(losses, dict):
        raise TypeError(f"forward(mode='loss') must return a dict of tensors, got "
                        f"{type(losses).__name__}")
    log_vars: dict[str, Any] = {}
    total = None
    n_losses = 0
    for key, value in losses.items():
        if isinstance(value, (list, tuple)):
            value = sum(v.mean() for v in value)
        elif value.dim():
            value = value.mean()
        log_vars[key] = value.detach()
        if "loss" in key:
            total = value if total is None else total + value
            n_losses += 1
    if total is None:
        raise ValueError(f"forward(mode='loss') returned no key containing 'loss' "
                         f"(keys: {', '.join(losses)})")
    if n_losses == 1 and "loss" in log_vars:  # the common case: log_vars['loss'] is the total
        return total, log_vars
    return total, {"loss": total.detach(), **log_vars}


def forward_and_update(runner: Any, data_batch: Any, step_allowed: Callable,
                       preprocess: Callable | None = None,
                       parse: Callable = parse_losses) -> dict:
    """One training step the general way (the loop's short path covers the plain case): the
    forward pass under the OptimWrapper's context (``preprocess``-ed first when the model has a
    data_preprocessor), the losses parsed, the step guards' verdict (a rejected step is counted
    and skipped), the update, and the clipped gradient norm handed to the logs."""
    model, optim_wrapper = runner.wrapped_model, runner.optim_wrapper
    with optim_wrapper.optim_context(model):
        data = preprocess(data_batch, True) if preprocess is not None else data_batch
        losses = call_model(model, data, "loss")
    loss, log_vars = parse(losses)
    guards = runner.step_guards
    if guards and not step_allowed(loss, guards):
        optim_wrapper.skip_update()
        log_vars["skipped_steps"] = 1.0
        return log_vars
    optim_wrapper.update_params(loss)
    return with_grad_norm(optim_wrapper, log_vars)


def with_grad_norm(optim_wrapper: Any, log_vars: dict) -> dict:
    """``log_vars`` with the gradient norm the OptimWrapper's clipping measured in this step
    (``grad_norm``), taken so that it is logged once."""
    if optim_wrapper.last_grad_norm is not None:
        log_vars["grad_norm"] = optim_wrapper.last_grad_norm
        optim_wrapper.last_grad_norm = None
    return log_vars
