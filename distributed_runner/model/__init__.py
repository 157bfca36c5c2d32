"""The model a run trains: building it from its config, MMEngine's model base classes, wrapping
(DDP, FSDP2) and its strategy, activation checkpointing, weight averages, test-time augmentation
and the example classifier.

The package forwards the names of the 0.1 module ``distributed_runner.model`` (now :mod:`.base`:
``BaseModel``, ``BaseDataPreprocessor``).
May import: parallel, core.
"""

from distributed_runner.core.moved import forward_names

__getattr__ = forward_names(__name__, "distributed_runner.model.base")
