"""Test-only helpers imported on Ray workers through ``custom_imports=['tests.ray_probe']``:
per-rank state dumps, a worker that dies once, and a record of which rank writes checkpoints."""
from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import distributed_runner.checkpoint.writer as checkpoint_writer
import tests.toy  # noqa: F401  (registers ToyDataset / ToyModel on the worker)
from distributed_runner.core.registry import HOOKS, MODELS
from hooks import Hook

_original_save = checkpoint_writer.atomic_save


def _recording_save(obj, path):
    """Every checkpoint write, with the rank that made it, appended to work_dir/writes.txt."""
    path = Path(path)
    rank = int(os.environ.get("RANK", torch.distributed.get_rank()
                              if torch.distributed.is_initialized() else 0))
    with open(path.parent / "writes.txt", "a") as f:
        f.write(f"{rank} {path.name}\n")
    return _original_save(obj, path)


checkpoint_writer.atomic_save = _recording_save


@MODELS.register_module(force=True)
class ToyLinear(nn.Module):
    """No BN, no dropout: DDP over 2 ranks with batch b equals one process with batch 2b."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 2)

    def forward(self, inputs, labels=None, mode="predict"):
        logits = self.fc2(torch.tanh(self.fc1(inputs)))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, labels)}
        return logits


@HOOKS.register_module(force=True)
class RankDumpHook(Hook):
    """After training, each rank saves its weights, buffers and the samples it trained on."""

    priority = "LOWEST"

    def after_train(self, runner) -> None:
        seen = getattr(runner.model, "seen", [])
        torch.save({"state": {k: v.detach().cpu() for k, v in runner.model.state_dict().items()},
                    "seen": list(seen), "iter": runner.iter, "world_size": runner.world_size},
                   Path(runner.work_dir) / f"dump_rank{runner.rank}.pt")


@HOOKS.register_module(force=True)
class DieOnceHook(Hook):
    """Rank ``rank`` kills its process after iteration ``at_iter`` — once per work_dir; the
    marker ``work_dir/died_once`` holds the iteration it died after.

    It waits ``delay`` seconds first: Ray's controller learns of a reported checkpoint when it
    next polls the workers, and a worker that dies before that restarts from the checkpoint
    before it (which resume handles too, but the test wants the mid-epoch one).

    ``persisted=N`` is for background saves (``async_save``): such a save commits — and is
    reported to Ray — at the first iteration at which every rank's write is done, which on a
    loaded machine can be several iterations later, and a death before the commit loses it (as
    it should). So the hook dies at the first iteration from ``at_iter`` on at which this rank
    has committed the checkpoint of iteration N and Ray has persisted it whole under the run's
    storage (waiting for Ray's background upload, up to ``upload_timeout`` seconds).
    """

    priority = "LOWEST"  # after CheckpointHook, which commits a finished background save

    def __init__(self, at_iter: int = -1, rank: int = 1, delay: float = 1.0,
                 persisted: int | None = None, upload_timeout: float = 60.0) -> None:
        self.at_iter, self.rank, self.delay = at_iter, rank, delay
        self.persisted, self.upload_timeout = persisted, upload_timeout
        self.committed = -1

    def after_save_checkpoint(self, runner, path, checkpoint) -> None:
        self.committed = max(self.committed, int(checkpoint.get("meta", {}).get("iter", -1)))

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        marker = Path(runner.work_dir) / "died_once"
        if runner.rank != self.rank or marker.exists() or runner.iter + 1 < self.at_iter:
            return
        if self.persisted is None:
            if runner.iter + 1 != self.at_iter:
                return
        elif self.committed < self.persisted:
            time.sleep(0.1)  # the background write gets the machine; the commit comes later
            return
        else:
            self._wait_until_persisted(runner)
        marker.write_text(str(runner.iter + 1))
        time.sleep(self.delay)
        os._exit(1)

    def _wait_until_persisted(self, runner) -> None:
        from distributed_runner.checkpoint.resume_choice import newest_persisted

        launcher = runner.cfg["launcher"]
        deadline = time.monotonic() + self.upload_timeout
        while newest_persisted(launcher["storage_path"], launcher["name"],
                               self.persisted - 1) is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"iteration {self.persisted}'s checkpoint was not persisted "
                                   f"under {launcher['storage_path']} in {self.upload_timeout} s")
            time.sleep(0.1)


@HOOKS.register_module(force=True)
class MarkNodeHook(Hook):
    """Rank ``rank`` writes its Ray node id to ``work_dir/node_of_rank<rank>`` after iteration
    ``at_iter`` (once per work_dir) and waits there, so that a test can kill the whole node."""

    def __init__(self, at_iter: int = -1, rank: int = 1, wait: float = 60.0) -> None:
        self.at_iter, self.rank, self.wait = at_iter, rank, wait

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        marker = Path(runner.work_dir) / f"node_of_rank{self.rank}"
        if runner.iter + 1 == self.at_iter and runner.rank == self.rank and not marker.exists():
            import ray
            time.sleep(1.0)  # Ray's controller learns of the iteration-7 checkpoint meanwhile
            marker.write_text(ray.get_runtime_context().get_node_id())
            time.sleep(self.wait)


@HOOKS.register_module(force=True)
class WaitWhileAloneHook(Hook):
    """After iteration ``at_iter`` of a group of one worker, write ``work_dir/alone`` (once per
    work_dir) and wait there, so that a test can add a node and watch Ray grow the group."""

    def __init__(self, at_iter: int = -1, wait: float = 90.0) -> None:
        self.at_iter, self.wait = at_iter, wait

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        marker = Path(runner.work_dir) / "alone"
        if runner.iter + 1 == self.at_iter and runner.world_size == 1 and not marker.exists():
            time.sleep(1.0)  # Ray's controller learns of the last checkpoint meanwhile
            marker.write_text(str(self.at_iter))
            time.sleep(self.wait)


@HOOKS.register_module(force=True)
class RecordGroupHook(Hook):
    """Rank 0 appends ``<iteration> <world size>`` to ``work_dir/groups.txt`` whenever a worker
    group starts training: the sizes a resized run went through and where each resumed."""

    def before_train(self, runner) -> None:
        if runner.rank == 0:
            with open(Path(runner.work_dir) / "groups.txt", "a") as f:
                f.write(f"{runner.iter} {runner.world_size}\n")
