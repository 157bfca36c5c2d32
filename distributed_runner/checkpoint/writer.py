"""Writing checkpoints, in the foreground or in the background (``async_save``).

One save, on every rank::

    wait()                      the previous save commits first: one save in flight at a time
    flush the sinks (rank 0)    a run resumed from this checkpoint finds every record up to it
    collect the state           every rank, the parts checkpoint.parts.PARTS declares (RNG,
                                sampler position ... are gathered: collectives)
    shards (sharded FSDP)       every rank hands its shards to torch.distributed.checkpoint
    before_save_checkpoint      hooks add to the checkpoint (EMA's average)
    write                       sync: now. async: the tensors are copied to host memory (the
                                only stall) and a background thread writes the file (DCP writes
                                the shards the same way)
    commit                      rank 0 writes the manifest (sharded); after_save_checkpoint on
                                every rank (CheckpointHook moves last_checkpoint and removes old
                                files, RayReportHook reports to Ray)

Why an asynchronous save commits at a point every rank agrees on: ``after_save_checkpoint``
reports to Ray (a barrier every rank must call equally often) and moves ``last_checkpoint``.
:meth:`CheckpointWriter.poll` (CheckpointHook calls it after every iteration while a save is in
flight) asks all ranks whether their writes are done — one small collective — and commits when
they all are; a new save, the end of training and a rollback wait for it. A crash before the
commit leaves no checkpoint that resume would pick: a one-file checkpoint appears under its name
only once complete (written to a temporary, renamed), and shards count only once the manifest
that names them exists.
"""

from __future__ import annotations

import copy
import pickle
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from distributed_runner.checkpoint.files import atomic_save
from distributed_runner.checkpoint.sharded import (
    SHARDED,
    TRAINABLE,
    after_manifest_written,
    finish_shards,
    start_shards,
    writes_shards,
)
from distributed_runner.checkpoint.state import collect_training_state
from distributed_runner.checkpoint.types import CheckpointSubject, SaveOptions
from distributed_runner.core import dist
from distributed_runner.health.heartbeat import CHECKPOINT, HEARTBEAT

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


def staged_copy(obj: Any, reuse: Any = None) -> Any:
    """``obj`` with every tensor copied to host memory and every container copied: what a
    background write may read while training changes the originals.

    ``reuse`` is the previous save's copy (written by then): a tensor of the same shape and
    dtype at the same place is copied into instead of allocated, because fresh memory costs
    page faults that take longer than the copy itself.
    """
    if isinstance(obj, torch.Tensor):
        if (
            isinstance(reuse, torch.Tensor)
            and reuse.shape == obj.shape
            and reuse.dtype == obj.dtype
        ):
            return reuse.copy_(obj.detach())
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        before = reuse if isinstance(reuse, dict) else {}
        return type(obj)((k, staged_copy(v, before.get(k))) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        olds = reuse if type(reuse) is type(obj) and len(reuse) == len(obj) else [None] * len(obj)
        return type(obj)(staged_copy(v, b) for v, b in zip(obj, olds, strict=True))
    return copy.deepcopy(obj)


@dataclass
class PendingSave:
    """A save whose bytes are still being written."""

    path: Path
    checkpoint: dict  # what hooks saw (after_save_checkpoint gets it at the commit)
    staged: Any  # rank 0's host-memory copy: the file or the manifest to write
    file: Future | None  # the one-file write (rank 0)
    shards: Any  # DCP's future for this rank's shards

    def written(self) -> bool:
        return all(f is None or f.done() for f in (self.file, self.shards))


class CheckpointWriter:
    """The Runner's checkpoint writer (``runner.checkpoints``); see the module docstring."""

    def __init__(self, runner: RunnerAPI) -> None:
        self._runner = runner
        self._pending: PendingSave | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._group: Any = None  # a gloo group of its own for DCP's background collectives
        self._staged: Any = None  # the last one-file copy, reused by the next save
        self._stager: Any = None  # DCP's stager, kept: it reuses its host buffers

    def save(
        self,
        path: Path,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        meta: dict | None = None,
        asynchronous: bool = False,
    ) -> Path:
        """Save the training state as ``path`` (call on every rank); see the module docstring."""
        with HEARTBEAT.slow(CHECKPOINT):  # the watchdog allows a save its own time
            return self._save(path, save_optimizer, save_param_scheduler, meta, asynchronous)

    def _save(
        self,
        path: Path,
        save_optimizer: bool,
        save_param_scheduler: bool,
        meta: dict | None,
        asynchronous: bool,
    ) -> Path:
        runner = self._runner
        self.wait()
        if runner.rank == 0:
            runner.sinks.flush()
        subject = CheckpointSubject.of(runner)
        sharded = writes_shards(subject.strategy, subject.model)
        meta = {**(meta or {}), **({"async_save": True} if asynchronous else {})}
        ckpt = collect_training_state(
            subject,
            SaveOptions(save_optimizer, save_param_scheduler, meta, with_weights=not sharded),
        )
        shards = None
        if sharded:
            optimizer = subject.optimizer() if save_optimizer else None
            ckpt[SHARDED], shards = start_shards(
                subject.model,
                optimizer,
                subject.rank,
                path,
                asynchronous,
                *self._async_tools(asynchronous),
                trainable=meta.get("weights") == TRAINABLE,
            )
        runner.call_hook("before_save_checkpoint", checkpoint=ckpt)
        if not asynchronous:
            self._commit(path, ckpt, ckpt, file_written=False)
            return path
        staged = file = None
        if runner.rank == 0 and sharded:  # a small manifest: pickling copies it fastest
            staged = pickle.loads(pickle.dumps(ckpt, protocol=pickle.HIGHEST_PROTOCOL))
        elif runner.rank == 0:  # the whole checkpoint, written by a thread of its own
            staged = self._staged = staged_copy(ckpt, self._staged)
            if self._thread is None:
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="drun-checkpoint")
            file = self._thread.submit(atomic_save, staged, path)
        self._pending = PendingSave(path, ckpt, staged, file, shards)
        return path

    def poll(self) -> None:
        """Commit the save in flight if every rank has written its part (a collective while a
        save is in flight, nothing otherwise)."""
        if self._pending is None:
            return
        done = torch.tensor([1 if self._pending.written() else 0])
        if int(dist.all_reduce(done, "min").item()):
            self.wait()

    def wait(self) -> None:
        """Block until the save in flight is written, then commit it (every rank)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        with HEARTBEAT.slow(CHECKPOINT):
            if pending.file is not None:
                pending.file.result()  # a write error surfaces here, as one line
            if pending.shards is not None:
                pending.shards.result()
            self._commit(
                pending.path,
                pending.checkpoint,
                pending.staged,
                file_written=pending.file is not None,
            )

    def _commit(self, path: Path, ckpt: dict, to_write: Any, file_written: bool) -> None:
        runner = self._runner
        if SHARDED in ckpt:
            finish_shards(runner.rank, path, ckpt[SHARDED])  # every rank's files, into the manifest
            if to_write is not None and to_write is not ckpt:  # rank 0's staged manifest
                to_write[SHARDED] = ckpt[SHARDED]
        if runner.rank == 0 and not file_written:
            atomic_save(to_write, path)  # with shards: the manifest, written last, commits
            if SHARDED in ckpt:
                after_manifest_written(path, ckpt)
        runner.call_hook("after_save_checkpoint", path=path, checkpoint=ckpt)

    def _async_tools(self, asynchronous: bool) -> tuple[Any, Any]:
        """(process group, stager) for DCP's background saves. Its thread runs collectives
        while training runs its own: on a gloo group of their own they cannot interleave (made
        once, on every rank). One stager for the run reuses its host buffers from save to save."""
        if not asynchronous:
            return None, None
        if self._group is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            self._group = torch.distributed.new_group(backend="gloo")
            self._stager = DefaultStager(StagingOptions(False, False, False, False))
        return self._group, self._stager
