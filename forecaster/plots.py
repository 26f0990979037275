"""The backtest picture: actual load against each model's forecast and band."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from forecaster.backtest import BacktestResult


def plot_backtest(results: list[BacktestResult], series, path: Path) -> None:
    """One panel per model (forecast at the full horizon vs actual, in req/s), and the
    error by horizon in the table's unit: requests per step. Clock time (UTC) on the x
    axis where the trace has one."""
    fig, axes = plt.subplots(len(results) + 1, 1, figsize=(12, 2.6 * (len(results) + 1)))
    legend = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": 7, "frameon": False}
    for ax, result in zip(axes, results, strict=False):
        at, label = _clock(result.times_s)
        rate = 1 / series.step_s
        ax.plot(at, result.actual * rate, lw=0.7, color="black", label="actual")
        ax.plot(at, result.mean * rate, lw=0.7, color="#1f77b4", label="forecast mean")
        ax.fill_between(
            at, result.lower * rate, result.upper * rate, alpha=0.3, color="#1f77b4", lw=0,
            label="band",
        )  # fmt: skip
        ax.set(
            ylabel="req/s",
            xlabel=label,
            title=f"{result.model}: forecast at the full horizon, coverage {result.coverage:.0%}",
        )
        ax.legend(**legend)
    step = f"{series.step_s:g} s" if series.step_s < 60 else f"{series.step_s / 60:g} min"
    for result in results:
        minutes = np.arange(1, result.per_horizon_mae.size + 1) * series.step_s / 60
        axes[-1].plot(minutes, result.per_horizon_mae, marker=".", label=result.model)
    axes[-1].set(
        xlabel="minutes ahead",
        ylabel=f"MAE (requests per {step} step)",
        title="error by horizon (the table's MAE unit)",
    )
    axes[-1].legend(**legend)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _clock(times_s: np.ndarray):
    """Unix seconds as UTC datetimes, or hours since the first origin for a trace
    without wall-clock time (its seconds start near 0)."""
    if times_s.size and times_s[0] > 1e8:  # after 1973: wall-clock time
        return [datetime.fromtimestamp(t, UTC) for t in times_s], "time (UTC)"
    return (times_s - times_s[0]) / 3600, "hours since the first origin"
