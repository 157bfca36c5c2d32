"""RayReportHook: every saved checkpoint reported to Ray Train, so a restarted worker group
resumes from it."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.checkpoint.files import checksum_path
from distributed_runner.checkpoint.sharded import SHARDED, is_ranks_file
from distributed_runner.core import dist
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import Hook
from distributed_runner.launch.ray_retention import RETENTION_SCORE, retention_score
from distributed_runner.validation.async_validation import report_validation

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class RayReportHook(Hook):
    """At ``after_save_checkpoint``: ``ray.train.report(metrics, checkpoint)`` — rank 0 passes
    the file (hard-linked into a fresh folder, copied across filesystems), the other ranks report
    ``None``; with sharded FSDP checkpoints every rank passes its own shard files. Ray persists
    it under the run's ``storage_path``; ``ray.train.get_checkpoint()`` hands it to a restarted
    worker group. An asynchronous save (``async_save``) is uploaded with
    ``CheckpointUploadMode.ASYNC``.

    ``ray.train.report`` is a barrier: every rank calls it once per saved checkpoint, which holds
    because checkpoints are saved at the same points on every rank. The metrics are the position
    and the latest validation results, so Ray's result table reads like the run's log.

    Added by ``--launcher ray`` to every worker's hooks (``drun hooks --launcher ray`` shows it);
    not meant for a config. Ranks: all report; rank 0 hands over the file.
    """

    priority = "LOWEST"

    def after_save_checkpoint(self, runner: RunnerAPI, path: Path, checkpoint: dict) -> None:
        import ray.train

        meta = checkpoint.get("meta", {})
        metrics: dict[str, Any] = {
            "epoch": meta.get("epoch"),
            "iter": meta.get("iter"),
            "checkpoint": Path(path).name,
            RETENTION_SCORE: self._retention_score(runner, meta),
        }
        # async validation: Ray validates this checkpoint and merges the metrics in itself
        validation = report_validation(runner, meta)
        for key, buf in runner.message_hub.log_scalars.items():
            if key.startswith("val/") and len(buf) and not validation:
                metrics[key] = buf.current()
        shards = checkpoint.get(SHARDED)
        if runner.rank != 0 and not shards:
            ray.train.report(metrics, checkpoint=None)
            return
        path = Path(path)
        name = f"{path.stem}-{time.time_ns()}"
        if shards:  # every rank uploads its own shard files into the one checkpoint folder
            name = dist.broadcast_object(name if runner.rank == 0 else "")  # rank 0's
        # an asynchronous save is uploaded asynchronously too: Ray copies the folder to
        # storage in the background and deletes it afterwards
        background = bool(meta.get("async_save"))
        upload = (
            {
                "checkpoint_upload_mode": ray.train.CheckpointUploadMode.ASYNC,
                "delete_local_checkpoint_after_upload": True,
            }
            if background
            else {}
        )
        tmp = tempfile.mkdtemp(prefix="drun-report-")
        try:
            for source, relative in self._files(runner.rank, path, shards):
                target = Path(tmp) / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(source, target)  # same filesystem: no copy before Ray persists it
                except OSError:
                    shutil.copy2(source, target)
            ray.train.report(
                metrics,
                checkpoint=ray.train.Checkpoint.from_directory(tmp),
                checkpoint_dir_name=name,
                **upload,
                **({"validation": validation} if validation else {}),
            )
        finally:
            if not background:
                shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _retention_score(runner: RunnerAPI, meta: dict) -> float:
        """This checkpoint's rank among those Ray keeps: the checkpoint hook's first
        ``save_best`` key and its rule (once 'auto' and an inferred rule are resolved)."""
        saver = runner.get_hook("checkpoint")
        keys = list(getattr(saver, "save_best", None) or [])
        rules = list(getattr(saver, "rules", None) or [])
        if not keys or keys[0] == "auto" or not rules:
            return retention_score(None, None, None)
        return retention_score(meta.get("best"), keys[0], rules[0])

    @staticmethod
    def _files(rank: int, path: Path, shards: dict | None) -> list[tuple[Path, str]]:
        """(file, its name in the reported folder) this rank hands over: rank 0 the checkpoint
        and its checksum (the checksum travels with it) and DCP's metadata; with shards, each
        rank its own ``__<rank>_*`` files — Ray merges the ranks' folders into one."""
        files = [(p, p.name) for p in (path, checksum_path(path)) if rank == 0 and p.is_file()]
        if shards:
            folder = path.parent / shards["dir"]
            files += [
                (f, f"{shards['dir']}/{f.name}")
                for f in sorted(folder.iterdir())
                if is_ranks_file(f.name, rank)
            ]
        return files
