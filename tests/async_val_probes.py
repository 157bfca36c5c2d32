"""Hooks the asynchronous-validation tests need in the training process *and* importable by the
validation process (``custom_imports``), which builds the same hooks from the same config."""
from __future__ import annotations

from pathlib import Path

from hooks import HOOKS, Hook


@HOOKS.register_module(force=True)
class DieAtHook(Hook):
    """Raises once at each of ``iters`` (completed iterations), as a crash mid-run would; a file
    in ``work_dir`` remembers the deaths already died, so the resumed run goes past them."""

    def __init__(self, iters: tuple = ()) -> None:
        self.iters = set(iters)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        done = runner.iter + 1
        marker = Path(runner.work_dir) / f"died_at_{done}"
        if done in self.iters and not marker.exists():
            marker.touch()
            raise RuntimeError(f"DieAtHook: dying at iteration {done}")
