"""``drun plot WORK_DIR [--out curves.png]``: loss, learning rate and validation metrics of a run,
drawn from its Parquet scalars (LoggerHook with the ``parquet`` sink)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from .sinks.parquet import read_scalars


def series(work_dir: str | Path) -> dict[tuple[str, str], tuple[list[int], list[float]]]:
    """(mode, tag) -> (steps, values)."""
    table = read_scalars(work_dir)
    out: dict[tuple[str, str], tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for mode, tag, step, value in zip(table["mode"].to_pylist(), table["tag"].to_pylist(),
                                      table["step"].to_pylist(), table["value"].to_pylist()):
        steps, values = out[(mode, tag)]
        steps.append(step)
        values.append(value)
    return dict(out)


def plot(work_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the figure; returns its path (default ``WORK_DIR/curves.png``)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = series(work_dir)
    timing = {"time", "data_time", "eta", "memory"}
    losses = {k: v for k, v in data.items() if k[0] == "train" and "loss" in k[1]}
    lrs = {k: v for k, v in data.items() if k[0] == "train" and k[1].startswith("lr")}
    metrics = {k: v for k, v in data.items() if k[0] in ("val", "test") and k[1] not in timing}
    panels = [(title, group) for title, group in (("training loss", losses),
                                                  ("learning rate", lrs),
                                                  ("validation", metrics)) if group]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(5 * max(len(panels), 1), 3.8),
                             squeeze=False)
    for ax, (title, group) in zip(axes[0], panels):
        for (mode, tag), (steps, values) in sorted(group.items()):
            ax.plot(steps, values, marker="o" if mode != "train" else None, markersize=3,
                    label=f"{mode}/{tag}")
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        if title == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    fig.suptitle(Path(work_dir).resolve().name)
    fig.tight_layout()
    path = Path(out) if out else Path(work_dir) / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
