"""Optimizers: the OptimWrapper (backward, accumulation, clipping, AMP, step), constructors
with per-parameter groups, and parameter schedulers.

``from distributed_runner.optim import OptimWrapper`` keeps working: the package forwards the
names of the 0.1 module ``distributed_runner.optim`` (now :mod:`.wrapper`).
May import: model, core.
"""

from distributed_runner.core.moved import forward_names

__getattr__ = forward_names(__name__, "distributed_runner.optim.wrapper")
