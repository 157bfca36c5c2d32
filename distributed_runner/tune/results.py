"""What a finished (or interrupted) sweep leaves in its work_dir, and the terminal table.

* ``tune_results.parquet``: one row per trial — ``trial_id``, every sampled value by its dotted
  key, the final and the best value of the metric, ``iter``/``epoch`` trained, ``stopped_early``
  (it ended before the run's length and without an error), ``status``, ``forks`` (PBT exploits)
  and ``work_dir``;
* ``best_config.py``: the base config with the best trial's values (``drun train`` runs it,
  into ``work_dir/best``);
* the table, best trial first.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from distributed_runner.core.config import Config, set_dotted, to_config_dict, to_plain

RESULTS_FILE = "tune_results.parquet"
BEST_CONFIG = "best_config.py"


def _number(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def trial_rows(
    results: Any,
    statuses: dict[str, str],
    metric: str,
    mode: str,
    length: int,
    unit: str,
    work_dir: Path,
) -> list[dict[str, Any]]:
    """One row per trial of Tune's ``ResultGrid`` (``statuses``: trial id -> ``TERMINATED`` or
    ``ERROR`` for the trials that ended; the others were interrupted)."""
    rows = []
    for result in results:
        last = dict(result.metrics or {})
        trial_id = last.get("trial_id") or Path(result.path).name
        history = result.metrics_dataframe
        best = None
        if history is not None and metric in history:
            values = [v for v in (_number(x) for x in history[metric]) if v is not None]
            if values:
                best = max(values) if mode == "max" else min(values)
        trained = int(last.get(unit) or 0)
        status = statuses.get(trial_id, "ERROR" if result.error else "INTERRUPTED")
        forks_file = work_dir / "trials" / trial_id / "tune_forks.jsonl"
        forks = forks_file.read_text().splitlines() if forks_file.is_file() else []
        row: dict[str, Any] = {"trial_id": trial_id}
        row.update(result.config or {})
        row.update(
            {
                f"final_{metric}": _number(last.get(metric)),
                f"best_{metric}": best,
                "iter": int(last.get("iter") or 0),
                "epoch": int(last.get("epoch") or 0),
                "stopped_early": status == "TERMINATED" and trained < length,
                "status": status,
                "forks": len(forks),
                "work_dir": str(work_dir / "trials" / trial_id),
            }
        )
        rows.append(row)
    sign = -1.0 if mode == "max" else 1.0
    rows.sort(key=lambda r: (r[f"best_{metric}"] is None, sign * (r[f"best_{metric}"] or 0.0)))
    return rows


def write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, list[Any]] = {}
    for row in rows:
        for key in row:
            columns.setdefault(key, [])
    for key, values in columns.items():
        values.extend(row.get(key) for row in rows)
        kinds = {type(v) for v in values if v is not None}
        if kinds == {int, float}:  # a column of numbers
            columns[key] = [None if v is None else float(v) for v in values]
        elif len(kinds) > 1:  # mixed (a choice over strings and numbers): as text
            columns[key] = [None if v is None else str(v) for v in values]
    pq.write_table(pa.table(columns), path)


def write_best_config(base: dict, values: dict[str, Any], work_dir: Path) -> Path:
    """``best_config.py``: ``base`` with ``values``, training into ``work_dir/best``."""
    cfg = Config(to_config_dict(to_plain(base)))
    cfg.pop("tune", None)
    for dotted, value in values.items():
        set_dotted(cfg, dotted, value)
    cfg["work_dir"] = str(work_dir / "best")  # its runs: best/<start time>/
    cfg["resume"] = False
    cfg.pop("run_name", None)
    path = work_dir / BEST_CONFIG
    header = (
        "# drun tune: the base config with the best trial's values; `drun train` runs it.\n"
        "# env_cfg.num_threads is the torch thread count every trial had (the CPUs Ray gave\n"
        "# it): with it this run repeats the trial's losses exactly; remove it to use every core.\n"
    )
    path.write_text(header + cfg.pretty_text())
    return path


def table(rows: list[dict[str, Any]], keys: list[str], metric: str) -> str:
    """The results as text, one trial a line, best first."""
    columns = ["trial_id", *keys, f"best_{metric}", f"final_{metric}", "epoch", "iter", "status"]
    columns.append("stopped_early")

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def summary_json(rows: list[dict[str, Any]], metric: str) -> str:
    best = rows[0] if rows else {}
    return json.dumps(
        {
            "trials": len(rows),
            "stopped_early": sum(bool(r["stopped_early"]) for r in rows),
            "errors": sum(r["status"] == "ERROR" for r in rows),
            "best_trial": best.get("trial_id"),
            f"best_{metric}": best.get(f"best_{metric}"),
        }
    )
