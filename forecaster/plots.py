"""The backtest picture: actual load against each model's forecast and band."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from forecaster.backtest import BacktestResult


def plot_backtest(results: list[BacktestResult], series, path: Path) -> None:
    """One panel per model (forecast at the full horizon vs actual), and per-horizon MAE."""
    fig, axes = plt.subplots(len(results) + 1, 1, figsize=(11, 2.6 * (len(results) + 1)))
    for ax, result in zip(axes, results, strict=False):
        hours = (result.times_s - result.times_s[0]) / 3600
        rate = 1 / series.step_s
        ax.plot(hours, result.actual * rate, lw=0.7, color="black", label="actual")
        ax.plot(hours, result.mean * rate, lw=0.7, label="forecast")
        ax.fill_between(hours, result.lower * rate, result.upper * rate, alpha=0.3, label="band")
        ax.set(
            ylabel="req/s",
            xlabel="hours since the first origin",
            title=f"{result.model}: forecast at the full horizon, coverage {result.coverage:.0%}",
        )
        ax.legend(fontsize=7, loc="upper left")
    for result in results:
        steps = np.arange(1, result.per_horizon_mae.size + 1) * series.step_s / 60
        axes[-1].plot(steps, result.per_horizon_mae / series.step_s, label=result.model)
    axes[-1].set(xlabel="minutes ahead", ylabel="MAE (req/s)", title="error by horizon")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
