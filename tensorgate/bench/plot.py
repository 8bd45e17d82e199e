"""``--plot FILE.png``: a latency-throughput curve for a sweep, a latency CDF for a single run.

matplotlib runs on the Agg backend (files only, no display), selected on a figure object of our
own rather than through ``pyplot``'s global state, so plotting works on headless CI machines
and inside client processes alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tensorgate.bench.report import RunReport


def plot_sweep(reports: Sequence[RunReport], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    throughput = [r.throughput for r in reports]
    for q, style in ((50.0, "o-"), (99.0, "s--")):
        axes.plot(throughput, [r.latency.get(q) * 1000 for r in reports], style, label=f"P{q:g}")
    for r in reports:
        axes.annotate(
            r.label, (r.throughput, r.latency.get(99.0) * 1000), fontsize=7, xytext=(3, 3), textcoords="offset points"
        )
    axes.set_xlabel("throughput (req/s)")
    axes.set_ylabel("latency (ms)")
    axes.set_title("latency vs throughput")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def plot_cdf(latencies: Sequence[float], label: str, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    values = np.sort(np.asarray(latencies, dtype=np.float64)) * 1000
    if values.size:
        axes.plot(values, np.arange(1, values.size + 1) / values.size, drawstyle="steps-post")
    axes.set_xlabel("latency (ms)")
    axes.set_ylabel("fraction of requests")
    axes.set_title(f"latency CDF ({label})")
    axes.grid(True, alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
