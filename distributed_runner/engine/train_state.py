"""TrainState: where a training run is — the one object that knows.

The training loops advance it, checkpoints record :meth:`TrainState.position` and give it back
with :meth:`TrainState.restore`, hooks read it through the Runner (``runner.epoch``,
``runner.iter``, ``runner.max_epochs``, ``runner.max_iters``, ``runner.by_epoch``,
``runner.train_state``). Nothing else keeps a copy.

Counters follow MMEngine: inside a hook ``epoch`` and ``iter`` count the epoch / iteration in
progress from 0 and advance *after* ``after_train_epoch`` / ``after_train_iter``. While those two
mount points run, ``finishing_step`` says which step is finishing, so a checkpoint saved there
records it as done (resume continues after it, never repeats it).

``data_epoch`` is the pass over the training data the sampler is in: the same as ``epoch`` in an
epoch-based run; in an iteration-based run (``epoch`` stays 0) it counts the wraps of the endless
data stream, so the sampler reshuffles per pass and resumes inside the right one.
"""

from __future__ import annotations

from dataclasses import dataclass


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
    # samples of this data pass trained ahead of its batches: a resume with a new global batch
    # at a sample position it does not divide (data/world_change.py); 0 otherwise
    epoch_offset: int = 0
    finishing_step: str | None = None  # 'iter' / 'epoch' while its after_* mount point runs
    val_due_after: bool = False  # a validation is due once the finishing step completes
    # restored from a checkpoint saved before a validation that was due (its meta 'val_pending'):
    # the resumed run validates first
    val_owed: bool = False

    # -- advancing (the loops) ---------------------------------------------------------------
    # An iteration's end (finishing('iter', val_due), after_train_iter, then iter and
    # batch_in_epoch advance) is written out in loops.run_iter only, not as a method here: it
    # runs every iteration, where a call costs, and the loop is where one reads an iteration.
    def finishing(self, step: str, val_due: bool = False) -> None:
        """The ``after_train_{step}`` mount point starts: the step counts as done from now on
        (``val_due``: a validation follows it)."""
        self.finishing_step, self.val_due_after = step, val_due

    def epoch_done(self) -> None:
        """``after_train_epoch`` returned: the next epoch (and data pass) is in progress; an
        iteration-based run's data pass stays where it stands (its one epoch ended training:
        the ``last.pth`` saved next records the pass's position, for a higher ``max_iters``)."""
        self.finishing_step, self.val_due_after = None, False
        if self.by_epoch:
            self.epoch += 1
            self.data_epoch += 1
            self.batch_in_epoch = self.epoch_offset = 0

    def next_data_pass(self) -> None:
        """An iteration-based run wrapped around its data."""
        self.data_epoch += 1
        self.batch_in_epoch = self.epoch_offset = 0

    # -- checkpoints ---------------------------------------------------------------------------
    def position(self) -> dict:
        """What has been completed, as a checkpoint's ``meta`` records it (exact at any mount
        point): ``epoch`` (the data pass), ``iter``, ``iter_in_epoch``, ``val_pending``, and
        ``epoch_offset`` (the pass's sample position is ``iter_in_epoch x global batch`` plus
        it: checkpoint/parts.py records it as ``samples_in_epoch``)."""
        if self.finishing_step == "iter":
            return {
                "epoch": self.data_epoch,
                "iter": self.iter + 1,
                "iter_in_epoch": self.batch_in_epoch + 1,
                "val_pending": self.val_due_after,
                "epoch_offset": self.epoch_offset,
            }
        if self.finishing_step == "epoch" and self.by_epoch:
            return {
                "epoch": self.data_epoch + 1,
                "iter": self.iter,
                "iter_in_epoch": 0,
                "val_pending": self.val_due_after,
                "epoch_offset": 0,
            }
        if self.finishing_step == "epoch":  # an iteration-based run's one epoch: its data pass
            return {  # goes on where it stands (a resume with a higher max_iters continues it)
                "epoch": self.data_epoch,
                "iter": self.iter,
                "iter_in_epoch": self.batch_in_epoch,
                "val_pending": self.val_due_after,
                "epoch_offset": self.epoch_offset,
            }
        return {
            "epoch": self.data_epoch,
            "iter": self.iter,
            "iter_in_epoch": self.batch_in_epoch,
            "val_pending": False,
            "epoch_offset": self.epoch_offset,
        }

    def restore(self, position: dict) -> None:
        """Continue after ``position`` (a checkpoint's ``meta``, as :meth:`position` wrote it)."""
        self.data_epoch = int(position["epoch"])
        self.epoch = self.data_epoch if self.by_epoch else 0
        self.iter = int(position["iter"])
        self.batch_in_epoch = int(position.get("iter_in_epoch", 0))
        self.epoch_offset = 0  # the loop sets it from the sample position (resume_from)
        self.val_owed = bool(position.get("val_pending", False))
        self.finishing_step, self.val_due_after = None, False

    @property
    def finished(self) -> bool:
        return self.iter >= self.max_iters
