"""MLflowCheckpointHook: the run's kept checkpoints as artifacts of its MLflow run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from distributed_runner.checkpoint.sharded import shard_folders
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class MLflowCheckpointHook(Hook):
    """After training, upload the last, best and published checkpoints (CheckpointHook's
    ``saved_files()``) to the MLflow run of the run's MLflow sink, under ``checkpoints/``, so the
    run is complete in MLflow alone. ``kinds`` picks which (default all three). The files are
    offered to every sink (``runner.sinks.log_artifact``); of the built-in ones only ``mlflow``
    keeps files, and a custom sink that implements ``LogSink.log_artifact`` gets them too.

    Needs an ``mlflow`` sink (LoggerHook's ``sinks=``) and ``checkpoint`` to be a CheckpointHook.
    Runs after CheckpointHook (LOWEST), on rank 0 only. The weights are plain ``state_dict``
    checkpoints (no pickled model class), loadable with ``torch.load(weights_only=True)`` anywhere.
    """

    priority = "LOWEST"

    def __init__(
        self,
        kinds: tuple[str, ...] = ("last", "best", "published"),
        artifact_path: str = "checkpoints",
    ) -> None:
        self.kinds = tuple(kinds)
        self.artifact_path = artifact_path
        self.uploaded: list[str] = []

    def after_train(self, runner: RunnerAPI) -> None:
        if runner.rank != 0:
            return
        checkpoint_hook = runner.get_hook("checkpoint")
        keeps_files = runner.sinks.offers("log_artifact")
        if (
            not keeps_files
            or checkpoint_hook is None
            or not hasattr(checkpoint_hook, "saved_files")
        ):
            runner.logger.warning(
                "MLflowCheckpointHook needs a sink that keeps artifacts — an 'mlflow' sink "
                "(default_hooks.logger.sinks) — and default_hooks.checkpoint: "
                "nothing uploaded"
            )
            return
        files = checkpoint_hook.saved_files()
        for kind in self.kinds:
            for path in files.get(kind, []):
                # offered to every sink; the one that keeps files (mlflow) uploads it
                if not runner.sinks.log_artifact(path, self.artifact_path):
                    continue
                self.uploaded.append(path.name)
                for shards in shard_folders(path):  # a sharded checkpoint's other half
                    runner.sinks.log_artifact(shards, f"{self.artifact_path}/{shards.name}")
        runner.logger.info("MLflow: uploaded %s", ", ".join(self.uploaded) or "no checkpoints")
