"""PNG plots of a simulation's timelines: load, tail latency and batching over the day."""

from __future__ import annotations

import contextlib
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from simulations.run import SimulationReport, spare_core


def write_plots(report: SimulationReport, out_dir: Path) -> list[Path]:
    """arrival_rate.png, p99.png, batching.png and control.png; returns the paths.

    The control plot (three panels per policy: as long to draw as the others together)
    is drawn in a forked process meanwhile, where there is a core for it."""
    names = ("arrival_rate.png", "p99.png", "batching.png", "control.png")
    paths = [out_dir / name for name in names]
    with contextlib.ExitStack() as stack:
        control = None
        if spare_core() and len(report.results) > 1:
            context = multiprocessing.get_context("fork")
            executor = stack.enter_context(ProcessPoolExecutor(1, mp_context=context))
            control = executor.submit(_plot_control, report, paths[3])
        _plot_arrivals(report, paths[0])
        _plot_p99(report, paths[1])
        _plot_batching(report, paths[2])
        if control is None:
            _plot_control(report, paths[3])
        else:
            control.result()  # its failure (a file that cannot be written) is raised here
    return paths


def _plot_control(report: SimulationReport, path: Path) -> None:
    """One row per policy: load with its forecast band (and the replicas, on a fleet
    that scales), the batch config, p99 vs SLO."""
    count = len(report.results)
    fig, axes = plt.subplots(count, 3, figsize=(16, 2.8 * count), sharex=True, squeeze=False)
    for (load, config, p99), result in zip(axes, report.results, strict=True):
        rows = result.timeline
        hours = _hours(rows)
        load.plot(hours, [r.arrival_rate_rps for r in rows], lw=0.7, label="actual")
        upper = [np.nan if r.forecast_upper_rps is None else r.forecast_upper_rps for r in rows]
        mean = [np.nan if r.forecast_rps is None else r.forecast_rps for r in rows]
        load.plot(hours, mean, lw=0.7, label="forecast")
        load.fill_between(hours, mean, upper, alpha=0.3, label="to upper bound")
        load.set(ylabel="req/s", title=result.policy)
        load.legend(fontsize=6)
        if report.scaling:  # the fleet that served it, on the same time axis
            fleet = load.twinx()
            fleet.step(hours, [r.replicas for r in rows], lw=0.8, color="black")
            fleet.set_ylabel("replicas", fontsize=7)
        config.step(hours, [r.max_batch_size for r in rows], lw=0.8, label="cap asked")
        config.step(hours, [r.served_max_batch for r in rows], lw=0.8, label="cap served")
        config.set(ylabel="max batch", yscale="log", title="batch cap and timeout")
        config.legend(fontsize=6, loc="upper left")
        timeout = config.twinx()
        timeout.step(hours, [r.timeout_ms for r in rows], lw=0.6, color="grey")
        timeout.set_ylabel("timeout (ms)", fontsize=7)
        p99.plot(hours, [np.nan if r.p99_ms is None else r.p99_ms for r in rows], lw=0.7)
        p99.axhline(report.slo_s * 1e3, color="red", ls="--", lw=1)
        p99.set(ylabel="p99 (ms)", yscale="log", title="p99 per window vs SLO")
    for ax in axes[-1]:
        ax.set_xlabel("hours")
    _save(fig, path)


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
