"""PNG plots of a simulation's timelines: load, tail latency and batching over the day.

Read at a glance: the x axis is the trace's clock time where it has one (hours since the
start otherwise), declared events are shaded, legends sit beside the data and list only
what a panel draws, the SLO line says its value, policies never take the SLO's red,
`oracle` is drawn dashed under the others, and batch caps read 32, 64, 128 on a log-2
axis with room above the largest.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import (
    FixedLocator,
    LogLocator,
    NullFormatter,
    NullLocator,
    ScalarFormatter,
)

from simulations.run import PolicyResult, SimulationReport, spare_core

SLO_COLOR = "#d62728"
POLICY_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79",
)  # fmt: skip
"""tab10 without its red, which is the SLO's."""
EVENT_COLOR = "#f2c744"
LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 7, "frameon": False}


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


# -- the time axis, events, styles -------------------------------------------------------


def _times(report: SimulationReport, seconds: np.ndarray | list[float]):
    """Seconds since the replay's start as what the x axis shows: clock time (UTC) where
    the trace has a clock, else hours."""
    seconds = np.asarray(seconds, dtype=np.float64)
    if report.clock_origin_s is None:
        return seconds / 3600.0
    return [datetime.fromtimestamp(report.clock_origin_s + s, UTC) for s in seconds]


def _row_times(report: SimulationReport, rows):
    return _times(report, [r.end_s for r in rows])


def _time_axis(ax, report: SimulationReport) -> None:
    if report.clock_origin_s is None:
        ax.set_xlabel("hours since the start")
        return
    locator = mdates.AutoDateLocator(minticks=3, maxticks=7)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC))
    ax.set_xlabel("time (UTC)")


def _mark_events(ax, report: SimulationReport) -> None:
    """Declared events shaded, labelled once (for the legend)."""
    for i, event in enumerate(report.events):
        start, end = _times(
            report, [event.start_s - report.origin_s, event.end_s - report.origin_s]
        )
        ax.axvspan(
            start,
            end,
            color=EVENT_COLOR,
            alpha=0.25,
            lw=0,
            label="declared events" if i == 0 else None,
        )


def _style(index: int, result: PolicyResult) -> dict:
    """A policy's line: its own colour (never the SLO's red); the oracle dashed, beneath."""
    if result.policy.startswith("oracle"):
        return {"color": "#444444", "ls": "--", "lw": 0.9, "zorder": 1}
    return {"color": POLICY_COLORS[index % len(POLICY_COLORS)], "lw": 0.9, "zorder": 2}


def _slo(ax, report: SimulationReport) -> None:
    slo_ms = report.slo_s * 1e3
    ax.axhline(slo_ms, color=SLO_COLOR, ls="--", lw=1, label=f"SLO {slo_ms:g} ms", zorder=3)


def _cap_axis(ax, caps: list[int]) -> None:
    """Log-2 with ticks 1, 2, 4, ... 128 as numbers, and room above the largest."""
    top = max(max(caps, default=1), 1)
    ax.set_yscale("log", base=2)
    ticks = [2**k for k in range(int(np.log2(top)) + 2)]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(0.8, top * 1.8)


def _latency_axis(ax) -> None:
    """Log scale read as plain milliseconds (20, 50, 100), not 2x10^1."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())


def _nan(values) -> list[float]:
    return [np.nan if v is None else v for v in values]


# -- the plots ---------------------------------------------------------------------------


def _plot_control(report: SimulationReport, path: Path) -> None:
    """One row per policy: load with its forecast band (and the replicas, on a fleet
    that scales), the batch config, p99 vs SLO."""
    count = len(report.results)
    fig, axes = plt.subplots(count, 3, figsize=(19, 2.9 * count), sharex=True, squeeze=False)
    for (load, config, p99), result in zip(axes, report.results, strict=True):
        rows = result.timeline
        at = _row_times(report, rows)
        _mark_events(load, report)
        load.plot(at, [r.arrival_rate_rps for r in rows], lw=0.7, color="black", label="actual")
        mean = _nan(r.forecast_rps for r in rows)
        if not np.all(np.isnan(mean)):  # only a policy that forecasts has a band
            upper = _nan(r.forecast_upper_rps for r in rows)
            load.plot(at, mean, lw=0.7, color=POLICY_COLORS[0], label="forecast mean")
            load.fill_between(
                at, mean, upper, alpha=0.3, color=POLICY_COLORS[0], lw=0, label="to upper bound"
            )
        load.set(ylabel="req/s", title=result.policy)
        handles, labels = load.get_legend_handles_labels()
        if report.scaling:  # the fleet that served it, on the same time axis
            fleet = load.twinx()
            fleet.step(
                at,
                [r.replicas for r in rows],
                lw=0.8,
                color="#555555",
                where="post",
                label="replicas",
            )
            fleet.set_ylabel("replicas", fontsize=7)
            more = fleet.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        load.legend(handles, labels, **LEGEND)
        _plot_config(config, rows, at)
        _mark_events(p99, report)
        p99.plot(at, _nan(r.p99_ms for r in rows), lw=0.7, color="black", label="p99")
        _slo(p99, report)
        p99.set(ylabel="p99 (ms)", title="p99 per window vs SLO")
        _latency_axis(p99)
        p99.legend(**LEGEND)
    for ax in axes[-1]:
        _time_axis(ax, report)
    _save(fig, path)


def _plot_config(ax, rows, at) -> None:
    """Cap asked, served and kept warm (log 2), and the timeout on its own axis."""
    asked = [r.max_batch_size for r in rows]
    served = [r.served_max_batch for r in rows]
    warm = [r.warm_max_batch if r.warm_max_batch > r.max_batch_size else np.nan for r in rows]
    ax.step(at, asked, where="post", lw=0.9, color=POLICY_COLORS[0], label="cap asked")
    ax.step(at, served, where="post", lw=0.9, ls=":", color=POLICY_COLORS[2], label="cap served")
    if not np.all(np.isnan(warm)):  # warmed above the cap, ahead of a spike
        ax.step(at, warm, where="post", lw=1.2, color=POLICY_COLORS[1], label="kept warm above")
    _cap_axis(ax, asked + served + [r.warm_max_batch for r in rows])
    ax.set(ylabel="max batch", title="batch cap and timeout")
    timeout = ax.twinx()
    timeouts = [r.timeout_ms for r in rows]
    timeout.step(at, timeouts, where="post", lw=0.7, color="#7f7f7f", label="timeout (ms)")
    timeout.set_ylim(
        0, max(max(timeouts, default=0.0) * 1.25, 1.0)
    )  # from 0: a constant stays flat
    timeout.set_ylabel("timeout (ms)", fontsize=7)
    handles, labels = ax.get_legend_handles_labels()
    more = timeout.get_legend_handles_labels()
    ax.legend(handles + more[0], labels + more[1], **{**LEGEND, "bbox_to_anchor": (1.1, 1.0)})


def _plot_arrivals(report: SimulationReport, path: Path) -> None:
    rows = report.results[0].timeline
    fig, ax = plt.subplots(figsize=(12, 3.5))
    _mark_events(ax, report)
    ax.plot(
        _row_times(report, rows),
        [r.arrival_rate_rps for r in rows],
        lw=0.8,
        color="black",
        label="arrivals",
    )
    ax.set(ylabel="arrivals (req/s)", title=f"{report.trace}: arrival rate")
    _time_axis(ax, report)
    ax.legend(**LEGEND)
    _save(fig, path)


def _plot_p99(report: SimulationReport, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(12, 4))
    _mark_events(ax, report)
    for i, result in enumerate(report.results):
        rows = result.timeline
        ax.plot(
            _row_times(report, rows),
            _nan(r.p99_ms for r in rows),
            label=result.policy,
            **_style(i, result),
        )
    _slo(ax, report)
    ax.set(ylabel="p99 latency (ms)", title=f"p99 per {report.window_s:g}s window")
    _latency_axis(ax)
    _time_axis(ax, report)
    ax.legend(**LEGEND)
    _save(fig, path)


def _plot_batching(report: SimulationReport, path: Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 6), sharex=True)
    for i, result in enumerate(report.results):
        rows = result.timeline
        at = _row_times(report, rows)
        style = _style(i, result)
        top.plot(at, _nan(r.mean_batch_size for r in rows), label=result.policy, **style)
        bottom.plot(at, [r.utilization for r in rows], **style)
    for ax in (top, bottom):
        _mark_events(ax, report)
    top.set(ylabel="mean batch size", title="batching")
    bottom.set(ylabel="worker utilisation", ylim=(0, 1.05))
    _time_axis(bottom, report)
    top.legend(**LEGEND)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
