"""Checkpoints: files and their integrity, the table of what a checkpoint holds (``parts``),
collecting and restoring the training state, foreground and background writers, sharded (DCP)
checkpoints, remote copies, published files, the one decision of which checkpoint a run starts
from (``resume_choice``), and Hugging Face model directories in and out (``hf/``:
``load_from=DIR`` read rank by rank, ``drun export``, LoRA's adapters).

The package forwards the names of the 0.1 module ``distributed_runner.checkpoint`` (now
:mod:`.files`: ``load_checkpoint``, ``save_checkpoint``, ``load_state_dict``...).
May import: model, health, data, optim, evaluation, core.
"""

from distributed_runner.core.moved import forward_names

__getattr__ = forward_names(__name__, "distributed_runner.checkpoint.files")
