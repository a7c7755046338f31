"""PNG figures of the suites (matplotlib, Agg backend): one panel per function or size, one
line per method, with an optional band (quartiles or standard errors)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

# label -> (x values, y values, lower band, upper band); bands may be None
Series = tuple[Sequence[float], Sequence[float], Sequence[float] | None, Sequence[float] | None]


def save_panels(
    path: str | Path,
    panels: Mapping[str, Mapping[str, Series]],
    *,
    xlabel: str,
    ylabel: str,
    logx: bool = False,
    logy: bool = False,
    title: str = "",
) -> Path:
    """Write one figure of ``panels`` (title -> series) as a PNG; returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    count = max(len(panels), 1)
    columns = min(count, 4)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    for ax, (name, series) in zip(axes.flat, panels.items(), strict=False):
        for label, (xs, ys, lo, hi) in series.items():
            (line,) = ax.plot(xs, ys, marker="o", markersize=3, label=label)
            if lo is not None and hi is not None:
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6), fontsize=7)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout(rect=(0, 0.06 + 0.02 * (len(labels) > 6), 1, 0.97 if title else 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
