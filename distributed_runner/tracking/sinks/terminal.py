"""TerminalSink: one MMEngine-style line per logging interval, through the run's logger."""

from __future__ import annotations

import datetime
import functools
import logging
import sys
from typing import TYPE_CHECKING, Any

from distributed_runner.core.log import LINE_FLUSHER, is_file_handler, log_info_line
from distributed_runner.core.registry import LOG_SINKS
from distributed_runner.tracking.sinks.base import LogRecord, LogSink

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI

_FIRST = ("lr", "eta", "time", "data_time", "memory")


def format_value(key: str, value: float) -> str:
    if key == "lr" or key.startswith("lr_"):
        return f"{value:.4e}"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


@functools.lru_cache(maxsize=64)
def _scalar_template(keys: tuple) -> tuple[tuple[str, ...], str]:
    """``keys`` (in record order) in display order, and one format string for their values: a
    run's records have a handful of key sets, and one str.format of a prepared template costs a
    fraction of formatting each value on its own."""
    order = tuple([k for k in _FIRST if k in keys] + [k for k in keys if k not in _FIRST])
    specs = (".4e" if k == "lr" or k.startswith("lr_") else ".4f" for k in order)
    return order, "  ".join(
        f"{k.replace('{', '{{').replace('}', '}}')}: {{:{spec}}}"
        for k, spec in zip(order, specs, strict=True)
    )


def format_scalars(scalars: dict[str, Any]) -> str:
    """``lr: 1.0000e-02  time: 0.0031  ...  loss: 0.4100`` (the first keys in _FIRST's order)."""
    order, template = _scalar_template(tuple(scalars))
    values = [scalars[k] for k in order]
    for value in values:
        if type(value) is not float:  # ints, numpy scalars: each as format_value shows it
            return "  ".join(
                f"{k}: {format_value(k, v)}" for k, v in zip(order, values, strict=True)
            )
    return template.format(*values)


def format_record(record: LogRecord) -> str:
    """``Epoch(train) [2][ 10/45]  eta: 0:00:12  lr: 1.0000e-02  time: 0.0031 ... loss: 0.41``."""
    info = record.info
    if record.mode == "train":
        if info.get("by_epoch", True):
            n, i = info.get("epoch_length", 0), info.get("iter_in_epoch", 0)
            where = f"Epoch(train) [{record.epoch}][{i:>{len(str(n))}}/{n}]"
        else:
            m = info.get("max_iters", 0)
            where = f"Iter(train) [{record.step:>{len(str(m))}}/{m}]"
    else:
        where = (
            f"Epoch({record.mode}) [{record.epoch}]"
            if info.get("by_epoch", True)
            else f"Iter({record.mode}) [{record.step}]"
        )
    parts = [where]
    if "async_applied_iter" in info:  # an asynchronous validation's result
        parts[0] += f" (async, applied at iter {info['async_applied_iter']})"
    if "eta" in info:
        parts.append(f"eta: {datetime.timedelta(seconds=int(info['eta']))}")
    if record.scalars:
        parts.append(format_scalars(record.scalars))
    if info.get("hooks"):
        parts.append("hooks(us/it): " + " ".join(f"{n} {us:.0f}" for n, us in info["hooks"]))
    return "  ".join(parts)


@LOG_SINKS.register_module()
class TerminalSink(LogSink):
    """One line per record through ``runner.logger`` (so also in ``work_dir/logs/run.log``).

    ``progress='auto'`` (default): on an interactive terminal a rich progress bar with the ETA
    and the latest values replaces the scrolling training lines; when stdout is not a TTY — CI,
    ``ray job`` logs, a file — plain lines. ``True`` or ``False`` force it. The log file always
    gets the plain lines.

    While the bar is live every other log line (validation, "new best ...", warnings) is printed
    *above* it through the bar's console, so neither clobbers the other. The bar does not wait
    for records: rich's refresh thread reads the position from ``runner.train_state`` about 8
    times a second, which costs the training thread nothing and gives an ETA within the first
    second.
    """

    def __init__(self, progress: str | bool = "auto", console: Any = None) -> None:
        if progress not in ("auto", True, False):
            from distributed_runner.core.errors import ConfigError

            raise ConfigError(
                "default_hooks.logger.sinks",
                "TerminalSink(progress=...) takes 'auto', True or False",
            )
        self.progress = progress
        self.console = console
        self._bar: Any = None
        self._rerouted: list[tuple[logging.StreamHandler, Any]] = []

    def open(self, runner: RunnerAPI) -> None:
        self._logger = runner.logger
        use_bar = self.progress is True or (self.progress == "auto" and sys.stdout.isatty())
        # a bar for training only: val()/test() alone print their lines
        if use_bar and runner.train_loop is not None and runner.max_iters:
            self._bar = _live_bar(self.console, runner.train_state)
            self._bar.start()
            # the logger's terminal handler writes through the bar's console from now on
            # (rich redirects sys.stdout/sys.stderr to print above the live bar)
            for handler in self._logger.handlers:
                if type(handler) is logging.StreamHandler:
                    proxy = sys.stderr if handler.stream is sys.__stderr__ else sys.stdout
                    self._rerouted.append((handler, handler.setStream(proxy)))

    def write(self, record: LogRecord) -> None:
        logger = self._logger
        on_bar = self._bar is not None and record.mode == "train"
        if logger.isEnabledFor(logging.INFO):  # while the bar owns the terminal: the files only
            log_info_line(
                logger,
                format_record(record),
                [h for h in logger.handlers if is_file_handler(h)] if on_bar else None,
                flush_now=record.mode != "train",
                created=record.created,
                queued=record.mode == "train",
            )
        if on_bar:
            self._bar.values = "  ".join(
                f"{k}: {format_value(k, v)}"
                for k, v in record.scalars.items()
                if k not in ("time", "data_time")
            )

    def flush(self) -> None:
        LINE_FLUSHER.flush_now()

    def close(self) -> None:
        LINE_FLUSHER.flush_now()
        if self._bar is not None:
            self._bar.sync()  # the final position, whatever the last refresh showed
            self._bar.stop()
            self._bar = None
        for handler, stream in self._rerouted:
            handler.setStream(stream)
        self._rerouted = []


def _live_bar(console: Any, state: Any) -> Any:
    """A rich Progress that, before each refresh, reads its position from ``state``."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    class StateProgress(Progress):
        values = ""
        task: TaskID | None = None

        def sync(self) -> None:
            if self.task is None:  # add_task refreshes before it returns the task's id
                return
            epoch = (
                f"epoch {min(state.epoch + 1, state.max_epochs)}/{state.max_epochs}"
                if state.by_epoch
                else "train"
            )
            self.update(
                self.task,
                completed=min(state.iter, state.max_iters),
                description=epoch,
                values=self.values,
            )

        def get_renderables(self):
            self.sync()
            return super().get_renderables()

    bar = StateProgress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[values]}"),
        console=console or Console(),
        transient=False,
        refresh_per_second=8,
        speed_estimate_period=60.0,
    )
    bar.task = bar.add_task("train", total=max(state.max_iters, 1), completed=state.iter, values="")
    return bar
