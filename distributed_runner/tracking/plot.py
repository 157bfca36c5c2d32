"""``drun plot WORK_DIR [WORK_DIR ...] [--all] [--out curves.png] [--smooth 0.6]``: training
loss, learning rate and validation metrics of one run, or of several overlaid for comparison.

A config's work_dir holds runs, a folder each (:mod:`distributed_runner.core.run_folders`):
``drun plot work_dirs/digits_cnn`` draws its newest run, ``--all`` overlays every run in it
(oldest first, each labelled with its folder's name), and a run's folder draws that run.

It reads what a default run writes — ``logs/scalars.jsonl`` (LoggerHook's default ``jsonl``
sink) — or the Parquet table when the run has one (``parquet`` sink). A resumed run's file holds
the steps a crashed attempt logged after its last checkpoint twice; the later value wins (an
exact resume logs the same one). Vertical lines mark epoch ends (from the validation records of
an epoch-based run); ``--smooth`` draws an exponential moving average over the raw training
curves (TensorBoard's, debiased), the raw ones faint behind. A ``drun tune`` sweep's work_dir
stands for its trials (``trials/*``): their curves are overlaid.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from distributed_runner.core.run_folders import runs_newest_first

Series = dict[tuple[str, str], tuple[list[int], list[float]]]
NOT_SCALARS = {"mode", "step", "epoch"}
TIMING = {"time", "data_time", "eta", "memory"}


def series(work_dir: str | Path) -> Series:
    """(mode, tag) -> (steps, values), one value per step (the last logged), sorted by step."""
    work_dir = Path(work_dir)
    parquet = work_dir / "logs" / "scalars"
    points: dict[tuple[str, str], dict[int, float]] = {}
    if parquet.is_dir() and any(parquet.glob("*.parquet")):
        from distributed_runner.tracking.sinks.parquet import read_scalars

        table = read_scalars(work_dir)
        rows = zip(
            table["mode"].to_pylist(),
            table["tag"].to_pylist(),
            table["step"].to_pylist(),
            table["value"].to_pylist(),
            strict=True,
        )
        for mode, tag, step, value in rows:
            points.setdefault((mode, tag), {})[int(step)] = float(value)
    else:
        jsonl = work_dir / "logs" / "scalars.jsonl"
        if not jsonl.is_file():
            raise FileNotFoundError(
                f"no logs/scalars.jsonl or logs/scalars/*.parquet in "
                f"{work_dir}: is it a work_dir of a run with the jsonl or "
                f"parquet sink?"
            )
        with jsonl.open(encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:  # the last line of a run killed mid-write
                    continue
                for tag, value in record.items():
                    if tag not in NOT_SCALARS and isinstance(value, (int, float)):
                        points.setdefault((record["mode"], tag), {})[int(record["step"])] = float(
                            value
                        )
    return {
        key: (sorted(by_step), [by_step[s] for s in sorted(by_step)])
        for key, by_step in points.items()
    }


def smoothed(values: Sequence[float], weight: float) -> list[float]:
    """Debiased exponential moving average (weight 0: the raw values)."""
    out, average = [], 0.0
    for i, value in enumerate(values, 1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**i) if weight > 0 else value)
    return out


def panels_of(data: Series) -> list[tuple[str, str, Series]]:
    """(title, y label, series) of the panels that have data."""
    losses = {k: v for k, v in data.items() if k[0] == "train" and "loss" in k[1]}
    lrs = {k: v for k, v in data.items() if k[0] == "train" and k[1].startswith("lr")}
    metrics = {k: v for k, v in data.items() if k[0] in ("val", "test") and k[1] not in TIMING}
    return [
        (title, label, group)
        for title, label, group in (
            ("training loss", "loss", losses),
            ("learning rate", "lr", lrs),
            ("validation", "metric", metrics),
        )
        if group
    ]


def build_figure(work_dirs: Sequence[str | Path], smooth: float = 0.0):
    """The figure for one run or several overlaid (one colour per run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not 0.0 <= smooth < 1.0:
        raise ValueError("--smooth must be in [0, 1)")
    runs = [(Path(w).resolve().name, series(w)) for w in work_dirs]
    titles = [
        t
        for t in ("training loss", "learning rate", "validation")
        if any(t == title for _, data in runs for title, _, _ in panels_of(data))
    ]
    fig, axes = plt.subplots(
        1, max(len(titles), 1), figsize=(5.2 * max(len(titles), 1), 4), squeeze=False
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-."]
    for r, (name, data) in enumerate(runs):
        colour = colours[r % len(colours)]
        # every validation tag is logged at the same steps: the ends of epochs
        epoch_ends = next((steps for (mode, _), (steps, _) in data.items() if mode == "val"), [])
        for title, label, group in panels_of(data):
            ax = axes[0][titles.index(title)]
            for i, ((mode, tag), (steps, values)) in enumerate(sorted(group.items())):
                legend = f"{name}: {mode}/{tag}" if len(runs) > 1 else f"{mode}/{tag}"
                style = styles[i % len(styles)]
                shown = values
                if mode == "train" and smooth > 0 and title == "training loss":
                    ax.plot(steps, values, color=colour, alpha=0.25, linestyle=style)
                    shown = smoothed(values, smooth)
                ax.plot(
                    steps,
                    shown,
                    color=colour,
                    linestyle=style,
                    label=legend,
                    marker="o" if mode != "train" else None,
                    markersize=3,
                )
            for end in epoch_ends[:-1]:
                ax.axvline(end, color=colour, alpha=0.15, linewidth=0.8)
            ax.set_ylabel(label)
    # not strict: with no series at all there is one empty panel and no title
    for ax, title in zip(axes[0], titles, strict=False):
        ax.set_title(
            title + (f" (smoothed {smooth:g})" if smooth and title == "training loss" else "")
        )
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if title == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    fig.suptitle(" vs ".join(name for name, _ in runs))
    fig.tight_layout()
    return fig


def expand_runs(work_dirs: Sequence[str | Path], every_run: bool = False) -> list[Path]:
    """The run folders to draw: a run's folder (it has logs) as given; a config's work_dir as its
    newest run, or every run oldest first with ``every_run``; a sweep's (``drun tune``: a
    ``trials/`` folder and no logs of its own) as its trials, in trial order."""
    out: list[Path] = []
    for work_dir in map(Path, work_dirs):
        trials = work_dir / "trials"
        if (work_dir / "logs").is_dir():
            out.append(work_dir)
        elif trials.is_dir():
            found = sorted(p for p in trials.iterdir() if (p / "logs").is_dir())
            if not found:
                raise FileNotFoundError(f"{work_dir}: a sweep whose trials logged nothing yet")
            out += found
        else:
            runs = [run for run in runs_newest_first(work_dir) if (run / "logs").is_dir()]
            if not runs:
                raise FileNotFoundError(
                    f"no run with logs in {work_dir}: is it the work_dir of a run with the jsonl "
                    f"or parquet sink, or a run's folder?"
                )
            out += list(reversed(runs)) if every_run else runs[:1]
    return out


def plot(
    work_dirs: str | Path | Sequence[str | Path],
    out: str | Path | None = None,
    smooth: float = 0.0,
    every_run: bool = False,
) -> Path:
    """Write the figure; returns its path (default ``curves.png`` in the first run drawn, or in
    the first folder given when several runs are)."""
    import matplotlib.pyplot as plt

    if isinstance(work_dirs, (str, Path)):
        work_dirs = [work_dirs]
    runs = expand_runs(work_dirs, every_run)
    fig = build_figure(runs, smooth)
    path = Path(out) if out else (runs[0] if len(runs) == 1 else Path(work_dirs[0])) / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
