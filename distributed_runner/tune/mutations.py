"""The config keys a running trial can change, for PBT: a key is mutable mid-run only when
something can apply a new value to a run resumed from another trial's checkpoint.

An exploited PBT trial continues the donor's run from the donor's checkpoint, then applies its
own values (:class:`hooks.tune_fork_hook.TuneForkHook`). A learning rate, weight decay or
momentum lives in the optimizer's param groups and can be rescaled there; a batch size, a model
width or an augmentation is baked into objects the checkpoint restores, so PBT may not mutate
them (a sweep that samples them once, with ASHA or a searcher, is fine).
"""

from __future__ import annotations

# dotted config key -> the param-group field its value is applied to
MUTABLE_KEYS: dict[str, str] = {
    "optim_wrapper.optimizer.lr": "lr",
    "optim_wrapper.optimizer.weight_decay": "weight_decay",
    "optim_wrapper.optimizer.momentum": "momentum",
}
