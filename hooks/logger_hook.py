"""LoggerHook: turns the MessageHub's scalars into records for the configured sinks."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from distributed_runner.checkpoint.remote import check_storage_options, copy_run_files, run_folder
from distributed_runner.core import dist
from distributed_runner.core.errors import ArgumentError
from distributed_runner.core.interval import Interval
from distributed_runner.core.log import log_brief_and_full, run_log_file
from distributed_runner.core.redact import redact_url
from distributed_runner.core.registry import HOOKS
from distributed_runner.engine.extension_points import RankFigures, SinkProvider
from distributed_runner.engine.hook import DataBatch, Hook
from distributed_runner.engine.hook_report import timing_summary, timing_table
from distributed_runner.tracking.sinks import LogRecord
from distributed_runner.validation.async_validation import validated_position

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI


SHARE_CHECK_SECONDS = 5.0


@HOOKS.register_module()
class LoggerHook(Hook, SinkProvider):
    """Every ``interval`` training iterations (and after each validation/test) write one record
    to the run's sinks (``runner.sinks``). ``sinks=['terminal', 'jsonl']`` by default names them
    (any ``dict(type=...)`` from the LOG_SINKS registry or a ``LogSink`` instance also works); as
    the :class:`~distributed_runner.engine.extension_points.SinkProvider`, this hook only names
    them — the Runner validates and builds them when it is built, and a misspelled one is a config
    error.

    ``interval``: an int or ``'Nit'`` counts batches of the epoch (MMEngine's rule); ``'2ep'``
    logs at the end of every 2nd epoch; ``'30s'``/``'5min'`` by wall time (rank 0's clock).
    Training values are smoothed over the iterations since the last record (``lr`` is the current
    value) and averaged across ranks; hooks that keep per-rank figures
    (:class:`~distributed_runner.engine.extension_points.RankFigures`, e.g. StragglerHook) have them
    gathered in the same collective and add the scalars they derive. ``ignore_last=False`` also logs
    the last iterations of an epoch that do not fill an interval.

    Hook timing (from the dispatcher's always-on timing): the table (hook, mount point, calls,
    total, mean) is logged after training; a hook whose cumulative time since the first record
    exceeds ``hook_time_warn_share`` of the wall time *and* ``hook_time_warn_seconds`` is warned
    about once (checked at most every :data:`SHARE_CHECK_SECONDS`) — the floor keeps a short run's
    one 70 ms checkpoint from reading as a hook over budget. ``top_hooks=N`` also puts the N
    slowest hooks of each window into the record (µs per iteration; the terminal line shows
    them) — off by default, as a diagnosis tool rather than something every line should carry.

    MMEngine's other options: every ``interval_exp_name`` iterations the experiment name is
    logged; ``out_dir`` (local or ``s3://``..., with ``backend_args``) receives, after the run,
    the files under the run's ``logs`` and in its folder whose names end with ``out_suffix``
    (MMEngine's list plus ``.jsonl``), under ``out_dir/<basename(work_dir)>/<run>``, and
    ``keep_local=False`` then deletes the local ones; ``file_client_args`` is accepted with a
    deprecation warning. ``log_metric_by_epoch=True`` (MMEngine's default) has metric backends
    (TensorBoard, MLflow, wandb) chart an epoch-based run's validation metrics at step = epoch;
    ``False`` puts them at the iteration count, on the training curves' axis. Files (JSON lines,
    Parquet) record both, whatever it says.

    A sink that raises is reported once and skipped for that record; the others still write
    (:class:`~distributed_runner.tracking.sinks.SinkSet`; ``on_error='warn'`` covers this hook
    itself). Ranks: all compute (the cross-rank average is a collective); rank 0 writes.
    """

    priority = "BELOW_NORMAL"
    on_error = "warn"
    _rank_figures: tuple[RankFigures, ...] = ()  # the providers, found at before_train

    def __init__(
        self,
        interval: int | str = 10,
        ignore_last: bool = True,
        sinks: Sequence[Any] = ("terminal", "jsonl"),
        top_hooks: int = 0,
        hook_time_warn_share: float = 0.1,
        hook_time_warn_seconds: float = 1.0,
        interval_exp_name: int = 1000,
        out_dir: str | None = None,
        out_suffix: str | Sequence[str] = (".json", ".jsonl", ".log", ".py", "yaml"),
        keep_local: bool = True,
        backend_args: dict | None = None,
        file_client_args: dict | None = None,
        log_metric_by_epoch: bool = True,
    ) -> None:
        self.every = Interval.parse(interval, by_epoch=False, key="interval")
        if self.every.never:
            raise ArgumentError("interval", "must be >= 1")
        self.interval = int(self.every.every) if self.every.kind == "iter" else 0
        self.ignore_last = ignore_last
        # validated where they are built (the Runner) or checked (the Ray driver, drun hooks):
        # SinkSet.build, with their config keys
        self.sink_specs = [sinks] if isinstance(sinks, (str, dict)) else list(sinks)
        self.top_hooks = int(top_hooks)
        self.hook_time_warn_share = float(hook_time_warn_share)
        self.hook_time_warn_seconds = float(hook_time_warn_seconds)
        self.interval_exp_name = int(interval_exp_name)
        self.log_metric_by_epoch = bool(log_metric_by_epoch)
        self.out_dir, self.keep_local, self.backend_args = out_dir, bool(keep_local), backend_args
        self.out_suffix = (out_suffix,) if isinstance(out_suffix, str) else tuple(out_suffix)
        check_storage_options("LoggerHook", out_dir, backend_args, file_client_args)
        self._last_logged = 0  # runner.iter when the last train record was written
        self._warned_hooks: set[str] = set()

    def before_train(self, runner: RunnerAPI) -> None:
        self._last_logged = runner.iter
        self._by_epoch = runner.by_epoch
        self._epoch_length = len(runner.train_dataloader)
        # the last batch of an epoch is logged even when it does not fill an interval
        self._log_tail = (
            self._by_epoch
            and self.every.kind == "iter"
            and (not self.ignore_last or self._epoch_length <= self.interval)
        )
        self._distributed = dist.is_distributed()
        if self._distributed:
            self._rank_figures = tuple(h for h in runner.hooks if isinstance(h, RankFigures))
        self.every.start_clock()
        self._hook_seconds = dict(runner.hook_seconds()) if self.top_hooks > 0 else {}
        self._share_base: tuple[float, dict] | None = None
        self._share_checked = 0.0

    def after_train_iter(
        self,
        runner: RunnerAPI,
        batch_idx: int,
        data_batch: DataBatch = None,
        outputs: dict | None = None,
    ) -> None:
        kind = self.every.kind
        if kind == "iter":
            due = (batch_idx + 1) % self.interval == 0 or (
                self._log_tail and batch_idx + 1 == self._epoch_length
            )
        elif kind == "epoch":
            due = (
                self._by_epoch
                and batch_idx + 1 == self._epoch_length
                and (runner.epoch + 1) % self.every.every == 0
            )
        else:
            due = self.every.time_due()
        if due:
            self._log_train(runner, batch_idx)
        if (
            self.interval_exp_name
            and (runner.iter + 1) % self.interval_exp_name == 0
            and runner.rank == 0
        ):
            runner.logger.info("Exp name: %s", runner.experiment_name)  # MMEngine's line

    def _log_train(self, runner: RunnerAPI, batch_idx: int) -> None:
        hub = runner.message_hub
        window = max(runner.iter + 1 - self._last_logged, 1)
        self._last_logged = runner.iter + 1
        current, smoothed = {}, {}
        for key, buf in hub.log_scalars.items():
            if key.startswith("train/") and len(buf):
                name = key[6:]
                if name.startswith("lr"):
                    current[name] = buf.current()
                else:
                    smoothed[name] = buf.mean(window)
        ranked: dict[str, float] = {}
        if self._distributed and (smoothed or self._rank_figures):
            smoothed, ranked = self._across_ranks(runner, smoothed)
        if runner.rank != 0:
            return
        scalars = {**current, **smoothed, **ranked}
        if runner.device.type == "cuda":
            scalars["memory"] = float(torch.cuda.max_memory_allocated(runner.device) // 2**20)
        info: dict[str, Any] = {
            "by_epoch": self._by_epoch,
            "iter_in_epoch": batch_idx + 1,
            "epoch_length": self._epoch_length,
            "max_iters": runner.max_iters,
        }
        self._check_hook_shares(runner)
        if self.top_hooks > 0:
            info["hooks"] = self._top_hooks(runner, window)
        eta = hub.get_info("eta")
        if eta is not None:
            info["eta"] = eta
        runner.sinks.write(LogRecord("train", runner.iter + 1, runner.epoch + 1, scalars, info))

    def _across_ranks(self, runner: RunnerAPI, smoothed: dict) -> tuple[dict, dict]:
        """The window's values averaged over the ranks, and the scalars the RankFigures
        providers derive from every rank's figures: one collective, an all_gather of this
        rank's values and figures (:func:`~distributed_runner.core.dist.all_gather_floats`); the
        means are summed in rank order."""
        figures = [[float(v) for v in hook.rank_figures()] for hook in self._rank_figures]
        if not smoothed and not any(figures):
            return {}, {}
        n = len(smoothed)
        table = dist.all_gather_floats([*smoothed.values(), *(v for own in figures for v in own)])
        world = len(table)
        avg = [sum(row[i] for row in table) / world for i in range(n)]
        ranked: dict[str, float] = {}
        start = n
        for hook, own in zip(self._rank_figures, figures, strict=True):
            if own:
                per_rank = [row[start : start + len(own)] for row in table]
                ranked.update(hook.figures_gathered(runner, per_rank))
                start += len(own)
        return dict(zip(smoothed, avg, strict=True)), ranked

    def _log_eval(self, runner: RunnerAPI, mode: str, metrics: dict | None) -> None:
        if runner.rank != 0:
            return
        scalars = {k: float(v) for k, v in (metrics or {}).items()}
        for name in ("time", "data_time"):
            buf = runner.message_hub.log_scalars.get(f"{mode}/{name}")
            if buf is not None and len(buf):
                scalars[name] = buf.mean(
                    len(runner.val_dataloader if mode == "val" else runner.test_dataloader)
                )
        by_epoch = self.log_metric_by_epoch and runner.by_epoch and mode == "val"
        # an asynchronous validation's results: at the validated checkpoint's step
        # (distributed_runner.validation.async_validation)
        at = (validated_position(runner) if mode == "val" else None) or {}
        step, epoch = at.get("iter", runner.iter), at.get("epoch", runner.epoch)
        info = {"by_epoch": runner.by_epoch, **({"async_applied_iter": runner.iter} if at else {})}
        runner.sinks.write(
            LogRecord(mode, step, epoch, scalars, info, metric_step=epoch if by_epoch else None)
        )

    def after_val_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        self._log_eval(runner, "val", metrics)

    def after_test_epoch(self, runner: RunnerAPI, metrics: dict | None = None) -> None:
        self._log_eval(runner, "test", metrics)

    def _top_hooks(self, runner: RunnerAPI, window: int) -> list[tuple[str, float]]:
        """The slowest hooks of this window as (name, µs per iteration)."""
        now_seconds = runner.hook_seconds()
        delta = {n: s - self._hook_seconds.get(n, 0.0) for n, s in now_seconds.items()}
        self._hook_seconds = now_seconds
        top = sorted(delta.items(), key=lambda kv: -kv[1])[: self.top_hooks]
        return [(name, 1e6 * seconds / window) for name, seconds in top if seconds > 0]

    def _check_hook_shares(self, runner: RunnerAPI, now_or_never: bool = False) -> None:
        """Warn once per hook whose cumulative share of the training wall time since the first
        record exceeds ``hook_time_warn_share`` (at most every SHARE_CHECK_SECONDS, unless
        ``now_or_never``: the last check, at the end of training)."""
        now = time.perf_counter()
        if self._share_base is None:  # first record: one-off start-up costs are not a trend
            self._share_base = (now, dict(runner.hook_seconds()))
            self._share_checked = now
            return
        if now - self._share_checked < SHARE_CHECK_SECONDS and not now_or_never:
            return
        self._share_checked = now
        now_seconds = runner.hook_seconds()
        elapsed = now - self._share_base[0]
        for name, total in now_seconds.items() if elapsed > 0 else ():
            spent = total - self._share_base[1].get(name, 0.0)
            if (
                spent / elapsed > self.hook_time_warn_share
                and name not in self._warned_hooks
                and spent >= self.hook_time_warn_seconds
            ):
                share = spent / elapsed
                self._warned_hooks.add(name)
                runner.logger.warning(
                    "hook %r took %.0f%% of the training time so far (above LoggerHook's "
                    "hook_time_warn_share=%.2f); see the hook time table at the end of training",
                    name,
                    100 * share,
                    self.hook_time_warn_share,
                )

    def after_train(self, runner: RunnerAPI) -> None:
        if self._share_base is not None:
            self._check_hook_shares(runner, now_or_never=True)  # a short run counts too
        if runner.rank == 0:  # the whole table in run.log, its summary on the terminal
            rows = runner.hook_timings()
            log_brief_and_full(
                runner.logger,
                timing_summary(rows, run_log_file(runner.logger)),
                timing_table(rows),
            )

    def after_run(self, runner: RunnerAPI) -> None:
        """Every record written and flushed; ``out_dir``: the run's logs and config (names ending
        with ``out_suffix``) copied to
        ``out_dir/<basename(work_dir)>``, as MMEngine does; ``keep_local=False`` deletes the
        local ones afterwards."""
        if runner.rank == 0:
            # the training records still queued (distributed_runner.tracking.sinks.record_queue)
            # are written now: a hook after this one at after_run finds the files whole, and so
            # do the copies below
            runner.sinks.flush()
        if self.out_dir and runner.rank == 0:
            names = copy_run_files(
                runner.work_dir,
                runner.run_name,
                self.out_dir,
                self.out_suffix,
                self.keep_local,
                self.backend_args,
                runner.logger,
            )
            runner.logger.info(
                "copied %d log files to %s",
                len(names),
                redact_url(run_folder(self.out_dir, runner.work_dir, runner.run_name)),
            )
