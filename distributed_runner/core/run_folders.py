"""Each run its own folder under ``work_dir``: how a run's folder is named, listed and found.

A config's ``work_dir`` (``work_dirs/digits_cnn``) holds runs, one folder each, as MMEngine's
timestamped folders and Lightning's ``version_N`` do::

    work_dirs/digits_cnn/
        20261128_194500/        a run: config.py, logs/, checkpoints, hangs/ ...
        20261128_195210/        the next run of the same config (the README's Ray command)
        ray_storage/            what Ray Train persisted, one folder per run name

so a run never appends to another's logs nor deletes another's checkpoints (``max_keep_ckpts``
counts its own folder's). ``run_name`` names the folder: a new timestamp by default (a second
suffix ``_2``, ``_3`` when two runs start in the same second), the run being continued with
``--resume``, or the user's name. ``run_name='.'`` is ``work_dir`` itself: the flat layout of
earlier versions, for a harness that already gives each run a folder of its own.

This module only names and lists; which run ``--resume`` continues (the newest that has a
checkpoint) is :func:`distributed_runner.checkpoint.resume_choice.choose_run`'s to say.
"""

from __future__ import annotations

import time
from pathlib import Path

FLAT = "."  # run_name for work_dir itself
NAME_FORMAT = "%Y%m%d_%H%M%S"
# what any run leaves in its folder as soon as it starts (config.py: Runner.from_cfg; logs/:
# the logger) or later (checkpoints, the pointer to the last one)
RUN_MARKERS = ("config.py", "logs", "last_checkpoint")
# folders of a work_dir that are not runs (Ray's and Tune's storage, a sweep's trials and best)
NOT_RUNS = frozenset({"ray_storage", "tune_storage", "trials"})


def run_dir(work_dir: str | Path, run_name: str | None) -> Path:
    """The folder a run writes to: ``work_dir/run_name`` (``work_dir`` itself for None or
    ``'.'``)."""
    work_dir = Path(work_dir)
    return work_dir if run_name in (None, "", FLAT) else work_dir / str(run_name)


def check_run_name(run_name: str) -> str | None:
    """Why ``run_name`` cannot name a folder under work_dir, or None when it can."""
    if run_name == FLAT:
        return None
    if not run_name or run_name in ("..",) or "/" in run_name or "\\" in run_name:
        return f"{run_name!r} is not a folder name: use letters, digits, '-', '_' or '.'"
    if run_name in NOT_RUNS:
        return f"{run_name!r} is a folder drun keeps for something else: choose another name"
    return None


def new_run_name(work_dir: str | Path, now: float | None = None) -> str:
    """A new run's name: the start time (``20261128_194500``), ``_2``, ``_3`` ... after it when
    a run of that second exists. Creates the folder, so that two runs starting together on one
    machine do not both take the name."""
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime(NAME_FORMAT, time.localtime(now))
    for n in range(1, 1000):
        name = stamp if n == 1 else f"{stamp}_{n}"
        try:
            (work_dir / name).mkdir()
            return name
        except FileExistsError:
            continue
    raise RuntimeError(f"{work_dir}: 999 runs started in second {stamp}")


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` holds a run: its config, logs, checkpoint pointer or a checkpoint."""
    if not path.is_dir() or path.name in NOT_RUNS:
        return False
    return any((path / marker).exists() for marker in RUN_MARKERS) or any(path.glob("*.pth"))


def last_activity(run: Path) -> float:
    """When ``run`` last wrote: the newest modification time of the folder, its entries and
    its logs (the scalars file changes with every logged iteration)."""
    entries = [run, *run.iterdir()]
    logs = run / "logs"
    if logs.is_dir():
        entries += list(logs.iterdir())
    times = []
    for entry in entries:
        try:
            times.append(entry.stat().st_mtime)
        except OSError:  # removed while listed (max_keep_ckpts of a running run)
            continue
    return max(times, default=0.0)


def runs_newest_first(work_dir: str | Path) -> list[Path]:
    """The run folders under ``work_dir``, the most recently active first. A work_dir of the
    flat layout (logs or checkpoints of its own) counts as a run too, ranked by its activity."""
    work_dir = Path(work_dir)
    if not work_dir.is_dir():
        return []
    runs = [p for p in work_dir.iterdir() if is_run_folder(p)]
    if is_run_folder(work_dir):
        runs.append(work_dir)
    return sorted(runs, key=last_activity, reverse=True)


def run_name_of(work_dir: str | Path, run: Path) -> str:
    """``run``'s name under ``work_dir`` (``'.'`` for work_dir itself)."""
    return FLAT if Path(run).resolve() == Path(work_dir).resolve() else Path(run).name


def runs_root(run_folder: str | Path, run_name: str) -> Path:
    """The config's ``work_dir`` a run's folder sits in (shared by its runs: MLflow's default
    SQLite store lives there, so that one experiment shows them all)."""
    run_folder = Path(run_folder)
    return run_folder if run_name == FLAT else run_folder.parent


def run_label(experiment_name: str, run_name: str, timestamp: str) -> str:
    """A run's name in MLflow and W&B: ``digits_cnn-20261128_194500`` (the experiment and the
    run's folder; a flat run, which has no folder of its own, takes its start time)."""
    return f"{experiment_name}-{timestamp if run_name == FLAT else run_name}"
