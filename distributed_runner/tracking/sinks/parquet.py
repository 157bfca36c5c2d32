"""ParquetSink: every scalar of the run as one table, and :func:`read_scalars` to read it back.

Rows: ``mode`` (train/val/test), ``tag`` (``loss``, ``lr``, ``accuracy`` ...), ``step`` (completed
training iterations), ``epoch``, ``value``, ``wall_time`` and ``attempt`` (one per process that
wrote). Files are only ever added — ``part-<attempt>-<n>.parquet``, each written to a temporary name
and renamed — so a crash cannot damage what was written, and a resumed run appends. A resumed run
logs again the steps between its checkpoint and the crash; :func:`read_scalars` keeps, for every
(mode, tag, step), the row of the latest attempt (exact resume makes them equal anyway).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from distributed_runner.core.registry import LOG_SINKS
from distributed_runner.tracking.sinks.base import LogRecord, LogSink

if TYPE_CHECKING:
    from distributed_runner.core.runner_api import RunnerAPI

COLUMNS = ("mode", "tag", "step", "epoch", "value", "wall_time", "attempt")


@LOG_SINKS.register_module()
class ParquetSink(LogSink):
    """Buffers rows and writes a part file every ``rows_per_file`` rows, at checkpoints and at
    the end of the run."""

    def __init__(self, folder: str = "logs/scalars", rows_per_file: int = 5000) -> None:
        self.folder = folder
        self.rows_per_file = int(rows_per_file)
        self._rows: list[tuple] = []
        self._part = 0
        self.path: Path | None = None

    def open(self, runner: RunnerAPI) -> None:
        self.path = Path(runner.work_dir) / self.folder
        self.path.mkdir(parents=True, exist_ok=True)
        self._attempt = time.time_ns()

    def write(self, record: LogRecord) -> None:
        now = record.created  # when it happened, not when the queue wrote it
        for tag, value in record.scalars.items():
            self._rows.append(
                (record.mode, tag, record.step, record.epoch, float(value), now, self._attempt)
            )
        if len(self._rows) >= self.rows_per_file:
            self.flush()

    def flush(self) -> None:
        if not self._rows or self.path is None:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = list(zip(*self._rows, strict=True))
        table = pa.table({name: pa.array(col) for name, col in zip(COLUMNS, columns, strict=True)})
        final = self.path / f"part-{self._attempt}-{self._part:05d}.parquet"
        tmp = final.with_name(f".{final.name}.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, final)
        self._part += 1
        self._rows = []

    def close(self) -> None:
        self.flush()


def read_scalars(work_dir: str | os.PathLike, folder: str = "logs/scalars") -> Any:
    """The run's scalars as a pyarrow Table, one row per (mode, tag, step), sorted by step."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(work_dir) / folder
    parts = sorted(path.glob("part-*.parquet"))
    if not parts:
        raise FileNotFoundError(
            f"no Parquet scalars under {path}: was ParquetSink configured "
            f"(LoggerHook(sinks=[..., 'parquet']))?"
        )
    table = pa.concat_tables(pq.read_table(p) for p in parts)
    # latest attempt wins for every (mode, tag, step)
    table = table.sort_by([("attempt", "descending")])
    keys = [
        f"{m}\x00{t}\x00{s}"
        for m, t, s in zip(
            table["mode"].to_pylist(),
            table["tag"].to_pylist(),
            table["step"].to_pylist(),
            strict=True,
        )
    ]
    seen: set[str] = set()
    keep = []
    for i, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    table = table.take(pa.array(keep, type=pa.int64()))
    return table.sort_by([("step", "ascending"), ("mode", "ascending"), ("tag", "ascending")])
