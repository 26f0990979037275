"""PNG plots of a simulation's timelines: load, tail latency and batching over the day.

Read at a glance: the x axis is the trace's clock time where it has one (hours since the
start otherwise), labelled once under the bottom panels; declared events are shaded;
legends sit above the panels, once per figure or column; the SLO line says its value and
sits inside the frame, and no policy takes its red. Policies' lines overlap for most of a
day (predictive and oracle nearly coincide), so p99 and batching are small multiples: one
panel per policy, in its colour, over the other policies in light grey, on one y scale.
Batch caps read 32, 64, 128 on a log-2 axis with room above the largest.
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import (
    FixedLocator,
    LogLocator,
    NullFormatter,
    NullLocator,
    ScalarFormatter,
)

from simulations.run import SimulationReport, spare_core
from simulations.timeline import WindowRow

SLO_COLOR = "#d62728"
POLICY_COLORS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#393b79",
)  # fmt: skip
"""tab10 without its red, which is the SLO's."""
EVENT_COLOR = "#f2c744"
OTHERS = {"color": "#c4c8cf", "lw": 0.6, "zorder": 1}
"""The other policies behind a policy's own panel: context, not competition."""
ASKED_COLOR, SERVED_COLOR, WARM_COLOR, TIMEOUT_COLOR = "#1f3b73", "#2ca02c", "#ff7f0e", "#555555"
FORECAST_COLOR = "#1f77b4"
ROW_HEIGHT = 1.75  # inches per small-multiple row
DPI = 110


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


def _times(report: SimulationReport, seconds: np.ndarray | list[float]) -> np.ndarray:
    """Seconds since the replay's start as what the x axis shows: clock time (UTC) where
    the trace has a clock, else hours. Clock time as matplotlib's date numbers, converted
    once: a day's datetimes, converted by every line that draws them, took seconds."""
    seconds = np.asarray(seconds, dtype=np.float64)
    if report.clock_origin_s is None:
        return seconds / 3600.0
    stamps = np.round((report.clock_origin_s + seconds) * 1e6).astype("datetime64[us]")
    return mdates.date2num(stamps)


def _row_times(report: SimulationReport, rows):
    return _times(report, [r.end_s for r in rows])


def _time_label(report: SimulationReport) -> str:
    """The x axis's one label; it carries the date, which the ticks leave out past midnight."""
    if report.clock_origin_s is None:
        return "hours since the start"
    start = datetime.fromtimestamp(report.clock_origin_s, UTC)
    return f"time (UTC) from {start:%Y-%m-%d %H:%M}"


def _time_axis(ax, report: SimulationReport) -> None:
    """Concise clock ticks, without the offset text: matplotlib dates it by the last tick
    (the next day, for a day's trace) and repeats it under every bottom panel."""
    if report.clock_origin_s is None:
        return
    locator = mdates.AutoDateLocator(minticks=3, maxticks=7)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=UTC, show_offset=False))


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


def _colour(index: int) -> str:
    return POLICY_COLORS[index % len(POLICY_COLORS)]


def _slo(ax, report: SimulationReport) -> None:
    slo_ms = report.slo_s * 1e3
    ax.axhline(slo_ms, color=SLO_COLOR, ls="--", lw=1.2, label=f"SLO {slo_ms:g} ms", zorder=4)


def _cap_axis(ax, caps: Iterable[int]) -> None:
    """Log-2 with ticks 1, 2, 4, ... 128 as numbers, and room above the largest."""
    top = max(max(caps, default=1), 1)
    ax.set_yscale("log", base=2)
    ticks = [2**k for k in range(int(np.log2(top)) + 2)]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(0.8, top * 1.8)


def _latency_axis(ax, values_ms: Iterable[float | None], slo_ms: float) -> None:
    """Log scale read as plain milliseconds (10, 20, 50, 100; 10, 30, 100, 300 over more
    decades), spanning at least a fifth of the SLO to twice it, so the SLO line sits
    inside the frame between labels."""
    seen = [v for v in values_ms if v is not None and np.isfinite(v) and v > 0]
    low = min(min(seen, default=slo_ms), slo_ms / 5) / 1.3
    high = max(max(seen, default=slo_ms), slo_ms * 2) * 1.3
    ax.set_yscale("log")
    ax.set_ylim(low, high)
    decades = np.log10(high / low)  # labels a short panel can hold apart
    subs = (1.0, 2.0, 5.0) if decades <= 2.2 else (1.0, 3.0) if decades <= 3.5 else (1.0,)
    ax.yaxis.set_major_locator(LogLocator(subs=subs, numticks=30))
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_locator(LogLocator(subs="all", numticks=30))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _nan(values) -> list[float]:
    return [np.nan if v is None else v for v in values]


def _row_title(ax, policy: str, colour: str) -> None:
    ax.set_title(policy, loc="left", fontsize=10, color=colour, fontweight="bold", pad=3)


def _legend_above(fig, title: str, entries: Sequence[tuple]) -> None:
    """The figure's title and one legend under it, above the panels: (handle, label)
    pairs. The title is the legend's: a suptitle and a legend outside the panels overlap
    under the constrained layout."""
    handles, labels = zip(*entries, strict=True)
    fig.legend(
        handles,
        labels,
        loc="outside upper center",
        ncol=len(entries),
        frameon=False,
        title=title,
        title_fontproperties={"size": 12},
    )


def _event_entry(report: SimulationReport) -> list[tuple]:
    patch = Patch(color=EVENT_COLOR, alpha=0.25, lw=0)
    return [(patch, "declared events")] if report.events else []


def _save(fig, path: Path) -> None:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


# -- the single-panel and small-multiple plots -------------------------------------------


def _plot_arrivals(report: SimulationReport, path: Path) -> None:
    rows = report.results[0].timeline
    fig, ax = plt.subplots(figsize=(12, 3.5), layout="constrained")
    _mark_events(ax, report)
    ax.plot(_row_times(report, rows), [r.arrival_rate_rps for r in rows], lw=0.8, color="k")
    ax.set(ylabel="arrivals (req/s)", xlabel=_time_label(report), ylim=(0, None))
    _time_axis(ax, report)
    _legend_above(
        fig,
        f"{report.trace}: arrival rate per {report.window_s:g} s window",
        [(Line2D([], [], color="k"), "arrivals"), *_event_entry(report)],
    )
    _save(fig, path)


Metric = Callable[[WindowRow], float | None]


def _small_multiples(report: SimulationReport, metrics: Sequence[tuple[str, Metric]]) -> tuple:
    """One row per policy, one column per metric: the policy in its colour over the others
    in grey, every column on one y scale. Returns the figure and the axes grid."""
    results = report.results
    fig, axes = plt.subplots(
        len(results),
        len(metrics),
        figsize=(12 if len(metrics) == 1 else 15, 1.0 + ROW_HEIGHT * len(results)),
        sharex=True,
        sharey="col",
        squeeze=False,
        layout="constrained",
    )
    at = {id(r): _row_times(report, r.timeline) for r in results}
    for i, result in enumerate(results):
        for ax, (ylabel, metric) in zip(axes[i], metrics, strict=True):
            _mark_events(ax, report)
            for other in results:
                if other is not result:
                    ax.plot(at[id(other)], _nan(metric(r) for r in other.timeline), **OTHERS)
            values = _nan(metric(r) for r in result.timeline)
            ax.plot(at[id(result)], values, color=_colour(i), lw=0.8, zorder=3)
            ax.set_ylabel(ylabel)
        _row_title(axes[i][0], result.policy, _colour(i))
    for ax in axes[-1]:
        _time_axis(ax, report)
    fig.supxlabel(_time_label(report), fontsize=10)  # once, under every column
    return fig, axes


def _plot_p99(report: SimulationReport, path: Path) -> None:
    fig, axes = _small_multiples(report, [("p99 (ms)", lambda r: r.p99_ms)])
    for ax in axes[:, 0]:
        _slo(ax, report)
    slo_ms = report.slo_s * 1e3
    _latency_axis(axes[0][0], (r.p99_ms for x in report.results for r in x.timeline), slo_ms)
    _legend_above(
        fig,
        f"p99 per {report.window_s:g} s window, one panel per policy",
        [
            (Line2D([], [], color=SLO_COLOR, ls="--", lw=1.2), f"SLO {slo_ms:g} ms"),
            (Line2D([], [], **OTHERS), "the other policies"),
            *_event_entry(report),
        ],
    )
    _save(fig, path)


def _plot_batching(report: SimulationReport, path: Path) -> None:
    metrics = [
        ("mean batch size", lambda r: r.mean_batch_size),
        ("worker utilisation", lambda r: r.utilization),
    ]
    fig, axes = _small_multiples(report, metrics)
    axes[0][0].set_ylim(0, None)
    axes[0][1].set_ylim(0, 1.05)
    _legend_above(
        fig,
        f"batching per {report.window_s:g} s window, one row per policy",
        [(Line2D([], [], **OTHERS), "the other policies"), *_event_entry(report)],
    )
    _save(fig, path)


# -- the control plot --------------------------------------------------------------------


def _plot_control(report: SimulationReport, path: Path) -> None:
    """One row per policy: load with its forecast band (and the replicas, on a fleet
    that scales), the batch config, p99 vs SLO. Each column has one y scale (the twin
    axes too) and its legend above it, in a header row."""
    results = report.results
    count = len(results)
    fig = plt.figure(figsize=(19, 1.0 + 2.5 * count), layout="constrained")
    grid = fig.add_gridspec(count + 1, 3, height_ratios=[0.42 * 2.5] + [2.5] * count)
    header = [fig.add_subplot(grid[0, j]) for j in range(3)]
    axes: list[list] = []  # one x axis for all, one y scale per column
    for i in range(count):
        row: list = []
        for j in range(3):
            shared_x = axes[0][0] if axes else (row[0] if row else None)
            shared_y = axes[0][j] if axes else None
            row.append(fig.add_subplot(grid[i + 1, j], sharex=shared_x, sharey=shared_y))
        axes.append(row)
    twins = {"replicas": [], "timeout": []}
    for i, ((load, config, p99), result) in enumerate(zip(axes, results, strict=True)):
        rows = result.timeline
        at = _row_times(report, rows)
        _plot_load(load, report, rows, at, twins["replicas"])
        _plot_config(config, report, rows, at, twins["timeout"])
        p99.plot(at, _nan(r.p99_ms for r in rows), lw=0.7, color="k", label="p99", zorder=3)
        _slo(p99, report)
        _mark_events(p99, report)
        p99.set_ylabel("p99 (ms)")
        _row_title(load, result.policy, _colour(i))
        if i < count - 1:
            for ax in (load, config, p99):
                ax.tick_params(labelbottom=False)
    _control_scales(report, axes, twins)
    _control_legends(report, header, axes, twins)
    for ax in axes[-1]:
        _time_axis(ax, report)
    fig.supxlabel(_time_label(report), fontsize=10)
    _save(fig, path)


def _plot_load(load, report: SimulationReport, rows, at, replica_axes: list) -> None:
    load.plot(at, [r.arrival_rate_rps for r in rows], lw=0.6, color="k", label="actual", zorder=3)
    mean = _nan(r.forecast_rps for r in rows)
    if not np.all(np.isnan(mean)):  # only a policy that forecasts has a band
        upper = _nan(r.forecast_upper_rps for r in rows)
        # Wider and beneath the actual load, which it follows closely: both stay visible.
        load.plot(at, mean, lw=1.6, color=FORECAST_COLOR, alpha=0.7, label="forecast mean")
        load.fill_between(
            at, mean, upper, alpha=0.25, color=FORECAST_COLOR, lw=0, label="to upper bound"
        )
    _mark_events(load, report)
    load.set_ylabel("req/s")
    if report.scaling:  # the fleet that served it, on the same time axis
        fleet = load.twinx()
        replicas = [r.replicas for r in rows]
        fleet.step(at, replicas, lw=1.0, color="#8c564b", where="post", label="replicas")
        fleet.set_ylabel("replicas", fontsize=9)
        replica_axes.append(fleet)


def _plot_config(ax, report: SimulationReport, rows, at, timeout_axes: list) -> None:
    """Cap served as a filled area, cap asked as a line over it (they part while a raised
    cap warms, and for the tick a change takes to land), the cap kept warm above them
    (log 2), and the timeout on its own axis, drawn beneath the caps."""
    asked = [r.max_batch_size for r in rows]
    served = [r.served_max_batch for r in rows]
    warm = [r.warm_max_batch if r.warm_max_batch > r.max_batch_size else np.nan for r in rows]
    ax.step(at, asked, where="post", lw=1.3, color=ASKED_COLOR, label="cap asked", zorder=3)
    ax.fill_between(
        at, 0.01, served, step="post", color=SERVED_COLOR, alpha=0.22, lw=0, label="cap served"
    )
    if not np.all(np.isnan(warm)):  # warmed above the cap, ahead of a spike
        ax.step(at, warm, where="post", lw=2.0, color=WARM_COLOR, label="kept warm above")
    _mark_events(ax, report)
    ax.set_ylabel("max batch")
    timeout = ax.twinx()
    timeouts = [r.timeout_ms for r in rows]
    timeout.step(
        at, timeouts, where="post", lw=0.8, ls="--", color=TIMEOUT_COLOR, label="timeout (ms)"
    )
    timeout.set_ylabel("timeout (ms)", fontsize=9)
    ax.set_zorder(timeout.get_zorder() + 1)  # the caps over the timeout ...
    ax.patch.set_visible(False)  # ... and the timeout seen through the caps' background
    timeout_axes.append(timeout)


def _control_scales(report: SimulationReport, axes, twins: dict[str, list]) -> None:
    """The columns' shared scales, from every policy's rows: the caps', the latency's,
    the load's from 0, and the twins' (timeout, replicas) from 0, the same in every row."""
    rows = [r for result in report.results for r in result.timeline]
    caps = [c for r in rows for c in (r.max_batch_size, r.served_max_batch, r.warm_max_batch)]
    _cap_axis(axes[0][1], caps)
    _latency_axis(axes[0][2], (r.p99_ms for r in rows), report.slo_s * 1e3)
    axes[0][0].set_ylim(0, None)
    tops = {
        "timeout": max((r.timeout_ms for r in rows), default=0.0),
        "replicas": max((r.replicas for r in rows), default=0),
    }
    for name, twin_axes in twins.items():
        for twin in twin_axes:
            twin.set_ylim(0, max(tops[name] * 1.25, 1.0))  # from 0: a constant stays flat
            if name == "replicas":
                twin.yaxis.get_major_locator().set_params(integer=True)


def _control_legends(report: SimulationReport, header, axes, twins: dict[str, list]) -> None:
    """Each column's legend, titled, in the header row above it: every entry any row draws."""
    titles = (
        "load (req/s)",
        "batch cap (max batch, log 2) and timeout",
        f"p99 per {report.window_s:g} s window vs SLO",
    )
    extra = {0: twins["replicas"], 1: twins["timeout"]}
    for j, (ax, title) in enumerate(zip(header, titles, strict=True)):
        seen: dict[str, object] = {}
        for source in [row[j] for row in axes] + extra.get(j, []):
            for handle, label in zip(*source.get_legend_handles_labels(), strict=True):
                seen.setdefault(label, handle)
        # The rows add entries in turn (the first may have no forecast): events go last.
        labels = sorted(seen, key=lambda label: label == "declared events")
        ax.axis("off")
        ax.legend(
            [seen[label] for label in labels],
            labels,
            loc="lower center",
            ncol=min(len(seen), 3),
            title=title,
            title_fontproperties={"weight": "bold", "size": 10},
            fontsize=9,
            frameon=False,
        )
