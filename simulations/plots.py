"""PNG plots of a simulation's timelines: load, tail latency and batching over the day."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from simulations.run import SimulationReport


def write_plots(report: SimulationReport, out_dir: Path) -> list[Path]:
    """arrival_rate.png, p99.png and batching.png; returns the paths written."""
    paths = [out_dir / "arrival_rate.png", out_dir / "p99.png", out_dir / "batching.png"]
    _plot_arrivals(report, paths[0])
    _plot_p99(report, paths[1])
    _plot_batching(report, paths[2])
    return paths


def _hours(rows) -> np.ndarray:
    return np.array([r.end_s for r in rows]) / 3600.0


def _plot_arrivals(report: SimulationReport, path: Path) -> None:
    rows = report.results[0].timeline
    fig, ax = plt.subplots(figsize=(11, 3.5))
    ax.plot(_hours(rows), [r.arrival_rate_rps for r in rows], lw=0.8)
    ax.set(xlabel="hours", ylabel="arrivals (req/s)", title=f"{report.trace}: arrival rate")
    _save(fig, path)


def _plot_p99(report: SimulationReport, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 4))
    for result in report.results:
        rows = result.timeline
        p99 = [np.nan if r.p99_ms is None else r.p99_ms for r in rows]
        ax.plot(_hours(rows), p99, lw=0.8, label=result.policy)
    ax.axhline(report.slo_s * 1e3, color="red", ls="--", lw=1, label="SLO")
    ax.set(
        xlabel="hours",
        ylabel="p99 latency (ms)",
        yscale="log",
        title=f"p99 per {report.window_s:g}s window",
    )
    ax.legend(fontsize=7)
    _save(fig, path)


def _plot_batching(report: SimulationReport, path: Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    for result in report.results:
        rows = result.timeline
        size = [np.nan if r.mean_batch_size is None else r.mean_batch_size for r in rows]
        top.plot(_hours(rows), size, lw=0.8, label=result.policy)
        bottom.plot(_hours(rows), [r.utilization for r in rows], lw=0.8)
    top.set(ylabel="mean batch size", title="batching")
    bottom.set(xlabel="hours", ylabel="worker utilisation", ylim=(0, 1.05))
    top.legend(fontsize=7)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
