"""TrainState: where a training run is — the one object that knows.

The training loops advance it, checkpoints record :meth:`TrainState.position` and give it back
with :meth:`TrainState.restore`, hooks read it through the Runner (``runner.epoch``,
``runner.iter``, ``runner.max_epochs``, ``runner.max_iters``, ``runner.by_epoch``,
``runner.train_state``). Nothing else keeps a copy.

Counters follow MMEngine: inside a hook ``epoch`` and ``iter`` count the epoch / iteration in
progress from 0 and advance *after* ``after_train_epoch`` / ``after_train_iter``. While those two
mount points run, ``pending`` says which step is finishing, so a checkpoint saved there records it
as done (resume continues after it, never repeats it).

``data_epoch`` is the pass over the training data the sampler is in: the same as ``epoch`` in an
epoch-based run; in an iteration-based run (``epoch`` stays 0) it counts the wraps of the endless
data stream, so the sampler reshuffles per pass and resumes inside the right one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class TrainState:
    """Position and bounds of one training run (see the module docstring)."""

    max_epochs: int = 0
    max_iters: int = 0
    by_epoch: bool = True
    epoch: int = 0
    iter: int = 0
    data_epoch: int = 0
    batch_in_epoch: int = 0  # completed batches of the current data pass
    pending: Optional[str] = None  # 'iter' / 'epoch' while its after_* mount point runs
    val_after_pending: bool = False  # a validation is due once the pending step completes
    val_pending: bool = False  # restored: the checkpoint was saved before a due validation

    # -- advancing (the loops) ---------------------------------------------------------------
    def finishing(self, step: str, val_due: bool = False) -> None:
        """The ``after_train_{step}`` mount point starts: the step counts as done from now on."""
        self.pending, self.val_after_pending = step, val_due

    def iteration_done(self) -> None:
        self.pending, self.val_after_pending = None, False
        self.iter += 1
        self.batch_in_epoch += 1

    def epoch_done(self) -> None:
        self.pending, self.val_after_pending = None, False
        if self.by_epoch:
            self.epoch += 1
            self.data_epoch += 1
        self.batch_in_epoch = 0

    def next_data_pass(self) -> None:
        """An iteration-based run wrapped around its data."""
        self.data_epoch += 1
        self.batch_in_epoch = 0

    # -- checkpoints ---------------------------------------------------------------------------
    def position(self) -> dict:
        """What has been completed, as a checkpoint's ``meta`` records it (exact at any mount
        point): ``epoch`` (the data pass), ``iter``, ``iter_in_epoch``, ``val_pending``."""
        if self.pending == "iter":
            return {"epoch": self.data_epoch, "iter": self.iter + 1,
                    "iter_in_epoch": self.batch_in_epoch + 1,
                    "val_pending": self.val_after_pending}
        if self.pending == "epoch":
            return {"epoch": self.data_epoch + 1 if self.by_epoch else self.data_epoch,
                    "iter": self.iter, "iter_in_epoch": 0, "val_pending": self.val_after_pending}
        return {"epoch": self.data_epoch, "iter": self.iter, "iter_in_epoch": self.batch_in_epoch,
                "val_pending": False}

    def restore(self, position: dict) -> None:
        """Continue after ``position`` (a checkpoint's ``meta``, as :meth:`position` wrote it)."""
        self.data_epoch = int(position["epoch"])
        self.epoch = self.data_epoch if self.by_epoch else 0
        self.iter = int(position["iter"])
        self.batch_in_epoch = int(position.get("iter_in_epoch", 0))
        self.val_pending = bool(position.get("val_pending", False))
        self.pending, self.val_after_pending = None, False

    @property
    def finished(self) -> bool:
        return self.iter >= self.max_iters
