"""NPUProfilerHook: Ascend NPU profiling (``torch_npu.npu.profile``) of iterations
``begin`` .. ``end - 1``, with MMEngine's arguments."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.hook import DataBatch, Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


@HOOKS.register_module()
class NPUProfilerHook(Hook):
    """Profile training iterations ``begin`` to ``end - 1`` (counting from 0) on rank 0 with
    ``torch_npu.npu.profile(result_path, use_e2e_profiler=...)``, as MMEngine's hook does.

    Built only where ``torch_npu`` (Ascend's PyTorch plugin) is importable; elsewhere building it
    is a one-line error naming the package, not a hook that silently does nothing.

    Differences from MMEngine, and why:
    * a relative ``result_path`` is under ``work_dir`` (MMEngine: the current directory, which Ray
      Train changes on workers);
    * ``exit_after_profiling=True`` ends training through ``runner.request_stop`` after the last
      profiled iteration, on every rank, instead of ``sys.exit()``: ``after_train`` and
      ``after_run`` still run, so sinks are closed and the MLflow run is marked finished.
    """

    priority = "VERY_LOW"

    def __init__(
        self,
        begin: int = 0,
        end: int = 1,
        result_path: str = "cann_profiling",
        exit_after_profiling: bool = True,
        use_e2e_profiler: bool = False,
        ge_profiling_to_std_out: bool = False,
    ) -> None:
        try:
            import torch_npu
        except ImportError as e:
            raise ArgumentError(
                "",
                "NPUProfilerHook needs the torch_npu package (Ascend NPUs; "
                "pip install torch-npu), which cannot be imported here",
            ) from e
        if int(begin) < 0 or int(begin) >= int(end):
            raise ArgumentError(
                "end",
                f"must be greater than begin ({begin}): iterations begin .. end - 1 are profiled",
            )
        self.begin, self.end = int(begin), int(end)
        self.result_path = result_path
        self.exit_after_profiling = bool(exit_after_profiling)
        self.use_e2e_profiler = bool(use_e2e_profiler)
        if ge_profiling_to_std_out:
            os.environ["GE_PROFILING_TO_STD_OUT"] = "1"
        self._npu = torch_npu
        self.profiler: Any = None
        self.profiling = False

    def before_run(self, runner: RunnerAPI) -> None:
        if runner.rank != 0:
            return
        if runner.train_loop is not None and self.end > runner.max_iters:
            raise ArgumentError(
                "end", f"{self.end} is past the last iteration (max_iters {runner.max_iters})"
            )
        path = Path(self.result_path)
        path = path if path.is_absolute() else Path(runner.work_dir) / path
        path.mkdir(parents=True, exist_ok=True)
        self.result_path = str(path)
        self.profiler = self._npu.npu.profile(
            self.result_path, use_e2e_profiler=self.use_e2e_profiler
        )

    def before_train_iter(
        self, runner: RunnerAPI, batch_idx: int, data_batch: DataBatch = None
    ) -> None:
        if self.profiler is not None and runner.iter == self.begin:
            self.profiler.__enter__()
            self.profiling = True
            runner.logger.info(
                "NPUProfilerHook: profiling iterations %d..%d into %s",
                self.begin,
                self.end - 1,
                self.result_path,
            )

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
    ) -> None:
        if runner.iter != self.end - 1:
            return
        if self.profiling:
            runner.logger.info("NPUProfilerHook: saving the profile (this may take minutes)")
            self.profiler.__exit__(None, None, None)
            self.profiling = False
        if self.exit_after_profiling:
            runner.request_stop(
                f"NPUProfilerHook: iterations {self.begin}..{self.end - 1} "
                f"profiled (exit_after_profiling=True)"
            )
