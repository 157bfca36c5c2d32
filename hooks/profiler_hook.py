"""ProfilerHook: torch.profiler over the first epochs or iterations, traces and an operator
table."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.registry import HOOKS
from distributed_runner.core.signatures import accepts
from distributed_runner.engine.hook import DataBatch, Hook

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


def _check_trace_keys(spec: dict) -> None:
    """``on_trace_ready``'s keys besides ``type`` are arguments of torch's trace handler
    (``tb_trace``) or of the operator table (``log_trace``), as in MMEngine."""
    if spec["type"] == "tb_trace":
        target, takes = (
            "torch.profiler.tensorboard_trace_handler",
            lambda k: k == "dir_name" or accepts(torch.profiler.tensorboard_trace_handler, k),
        )
    else:
        from torch.autograd.profiler_util import EventList

        target, takes = (
            "the operator table (EventList.table)",
            lambda k: accepts(EventList.table, k),
        )
    for key in spec:
        if key != "type" and not takes(key):
            raise ArgumentError(f"on_trace_ready.{key}", f"{target} takes no {key!r}")


@HOOKS.register_module()
class ProfilerHook(Hook):
    """Profile the first ``profile_times`` epochs (``by_epoch=True``) or iterations of training.

    * activities: ``activity_with_cpu`` (default on), ``activity_with_cuda`` (default off, as in
      MMEngine; ``None`` turns it on when the run uses CUDA); ``record_shapes``,
      ``profile_memory``, ``with_stack``, ``with_flops``;
    * ``schedule=dict(wait=1, warmup=1, active=3, repeat=1)``: torch.profiler's schedule, stepped
      every iteration (or epoch) while profiling;
    * ``on_trace_ready=dict(type='tb_trace')`` writes traces TensorBoard's profiler plugin reads to
      ``work_dir/tf_tracing_logs``; its other keys go to ``tensorboard_trace_handler`` as in
      MMEngine (``dir_name``, ``worker_name`` — default ``rank<N>`` —, ``use_gzip``).
      ``dict(type='log_trace')`` only logs the table; its other keys go to the table as in
      MMEngine (``sort_by``, ``row_limit``, ``max_name_column_width``, ...). A callable gets the
      profiler. A key neither function takes is a one-line error;
    * ``json_trace_path``: also export a Chrome trace (``chrome://tracing``, Perfetto); a relative
      path is under ``work_dir``; ``{rank}`` in it is replaced;
    * when profiling ends, the per-operator table (``sort_by``, ``row_limit``) goes to the log.

    ``on_error='warn'``: a profiling failure is reported, training goes on.
    Ranks: every rank profiles itself (its trace file names carry the rank); rank 0 logs.
    """

    priority = "VERY_LOW"
    on_error = "warn"  # a profiling problem never stops training

    def __init__(
        self,
        by_epoch: bool = True,
        profile_times: int = 1,
        activity_with_cpu: bool = True,
        activity_with_cuda: bool | None = False,
        schedule: dict | None = None,
        on_trace_ready: Callable | dict | None = None,
        record_shapes: bool = False,
        profile_memory: bool = False,
        with_stack: bool = False,
        with_flops: bool = False,
        json_trace_path: str | None = None,
        sort_by: str | None = None,
        row_limit: int = 20,
    ) -> None:
        if int(profile_times) < 1:
            raise ArgumentError("profile_times", "must be >= 1")
        if isinstance(on_trace_ready, dict) and on_trace_ready.get("type") not in (
            "tb_trace",
            "log_trace",
        ):
            raise ArgumentError(
                "on_trace_ready.type", "use 'tb_trace' or 'log_trace' (or pass a callable)"
            )
        if isinstance(on_trace_ready, dict):
            _check_trace_keys(on_trace_ready)
        if schedule is not None and not isinstance(schedule, dict):
            raise ArgumentError(
                "schedule",
                "a dict of torch.profiler.schedule arguments, "
                "e.g. dict(wait=1, warmup=1, active=3)",
            )
        self.by_epoch, self.profile_times = bool(by_epoch), int(profile_times)
        self.activity_with_cpu, self.activity_with_cuda = activity_with_cpu, activity_with_cuda
        self.schedule, self.on_trace_ready = schedule, on_trace_ready
        self.options: dict[str, Any] = {
            "record_shapes": record_shapes,
            "profile_memory": profile_memory,
            "with_stack": with_stack,
            "with_flops": with_flops,
        }
        self.json_trace_path, self.sort_by, self.row_limit = json_trace_path, sort_by, row_limit
        self.profiler: Any = None
        self.table: str = ""
        self.trace_dir: Path | None = None
        self.worker_name = ""
        self._steps = 0

    def _activities(self, runner: RunnerAPI) -> list:
        acts = []
        if self.activity_with_cpu:
            acts.append(torch.profiler.ProfilerActivity.CPU)
        cuda = self.activity_with_cuda
        if cuda is None:
            cuda = runner.device.type == "cuda"
        if cuda:
            if not torch.cuda.is_available():
                raise ArgumentError("activity_with_cuda", "CUDA is not available here")
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        if not acts:
            raise ArgumentError(
                "", "no activity to profile: enable activity_with_cpu or activity_with_cuda"
            )
        return acts

    def _trace_handler(self, runner: RunnerAPI) -> Callable | None:
        spec = self.on_trace_ready
        if callable(spec):
            return spec
        if isinstance(spec, dict) and spec["type"] == "tb_trace":
            options = {k: v for k, v in spec.items() if k not in ("type", "dir_name")}
            options.setdefault("worker_name", f"rank{runner.rank}")
            self.worker_name = options["worker_name"]
            self.trace_dir = Path(runner.work_dir) / spec.get("dir_name", "tf_tracing_logs")
            return torch.profiler.tensorboard_trace_handler(str(self.trace_dir), **options)
        return None

    def before_train(self, runner: RunnerAPI) -> None:
        schedule = torch.profiler.schedule(**self.schedule) if self.schedule else None
        # acc_events: the table covers every active cycle of the schedule, not just the last
        extra: dict[str, Any] = (
            {"acc_events": True}
            if schedule is not None and accepts(torch.profiler.profile, "acc_events")
            else {}
        )
        self.profiler = torch.profiler.profile(
            activities=self._activities(runner),
            schedule=schedule,
            on_trace_ready=self._trace_handler(runner),
            **self.options,
            **extra,
        )
        self.profiler.__enter__()
        self._steps = 0

    def _step(self, runner: RunnerAPI) -> None:
        if self.profiler is None:
            return
        self._steps += 1
        if self.schedule:
            self.profiler.step()
        if self._steps >= self.profile_times:
            self._stop(runner)

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
    ) -> None:
        if not self.by_epoch:
            self._step(runner)

    def after_train_epoch(self, runner: RunnerAPI) -> None:
        if self.by_epoch:
            self._step(runner)

    def after_train(self, runner: RunnerAPI) -> None:
        self._stop(runner)  # training ended before profile_times

    def _stop(self, runner: RunnerAPI) -> None:
        prof, self.profiler = self.profiler, None
        if prof is None:
            return
        prof.__exit__(None, None, None)
        if self.json_trace_path:
            path = Path(self.json_trace_path.format(rank=runner.rank))
            path = path if path.is_absolute() else Path(runner.work_dir) / path
            path.parent.mkdir(parents=True, exist_ok=True)
            saved = (
                sorted(
                    self.trace_dir.glob(f"{self.worker_name}*.json"),
                    key=lambda p: p.stat().st_mtime,
                )
                if self.trace_dir
                else []
            )
            if saved:  # the TensorBoard handler already wrote this Chrome-format trace
                shutil.copyfile(saved[-1], path)
            else:
                prof.export_chrome_trace(str(path))
        try:
            averages = prof.key_averages()
        except (AssertionError, RuntimeError):  # a schedule whose active window never came
            runner.logger.warning(
                "ProfilerHook: nothing was recorded; check schedule= against profile_times=%d",
                self.profile_times,
            )
            return
        cuda = any(a == torch.profiler.ProfilerActivity.CUDA for a in prof.activities)
        sort_by = self.sort_by or ("self_cuda_time_total" if cuda else "self_cpu_time_total")
        table_options = {"sort_by": sort_by, "row_limit": self.row_limit}
        if isinstance(self.on_trace_ready, dict) and self.on_trace_ready["type"] == "log_trace":
            table_options.update((k, v) for k, v in self.on_trace_ready.items() if k != "type")
        self.table = averages.table(**table_options)
        runner.logger.info(
            "profile of the first %d %s (rank %d):\n%s",
            self.profile_times,
            "epochs" if self.by_epoch else "iterations",
            runner.rank,
            self.table,
        )
