"""Forecaster cost per control tick and per full fit, on a 14-day history at 1 minute.

Targets (issue 3): update + predict under 10 ms at p99, a full fit under 2 s. The
baseline is what a controller would do with statsmodels alone to absorb each new point:
refit the model (ExponentialSmoothing.fit) and forecast. Both are timed side by side.

    python benchmarks/forecast_speed.py [--ticks 2000] [--baseline-ticks 5]

Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np
from statsmodels.tsa.holtwinters import ExponentialSmoothing

from forecaster.models import SeasonalNaive
from forecaster.series import RateSeries
from forecaster.smoothing import Holt, HoltWinters, MstlHolt

STEP_S, DAY_STEPS, HORIZON = 60.0, 1440, 10


def synthetic(days: int, seed: int = 0) -> np.ndarray:
    t = np.arange(days * DAY_STEPS)
    rng = np.random.default_rng(seed)
    daily = 400 * np.sin(2 * np.pi * t / DAY_STEPS)
    weekly = 150 * np.sin(2 * np.pi * t / (7 * DAY_STEPS))
    return np.maximum(0, 2000 + daily + weekly + rng.normal(0, 40, t.size))


def time_model(model, history: np.ndarray, future: np.ndarray) -> dict:
    started = time.perf_counter()
    fitted = model.fit(RateSeries(0.0, STEP_S, history))
    fit_s = time.perf_counter() - started
    costs = []
    for value in future:
        started = time.perf_counter()
        fitted.update(np.array([value]))
        fitted.predict(HORIZON)
        costs.append((time.perf_counter() - started) * 1e3)
    return {
        "fit_s": fit_s,
        "tick_ms_mean": float(np.mean(costs)),
        "tick_ms_p99": float(np.percentile(costs, 99)),
    }


def time_refit_baseline(history: np.ndarray, future: np.ndarray) -> dict:
    costs = []
    for i, _ in enumerate(future):
        data = np.concatenate((history[i + 1 :], future[: i + 1]))
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = ExponentialSmoothing(
                data,
                trend="add",
                damped_trend=True,
                seasonal="add",
                seasonal_periods=DAY_STEPS,
                initialization_method="heuristic",
            )
            model.fit(use_brute=False).forecast(HORIZON)
        costs.append((time.perf_counter() - started) * 1e3)
    return {"tick_ms_mean": float(np.mean(costs)), "tick_ms_p99": float(np.max(costs))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ticks", type=int, default=2000)
    parser.add_argument("--baseline-ticks", type=int, default=5)
    args = parser.parse_args()
    series = synthetic(14 + 2)
    history, future = series[: 14 * DAY_STEPS], series[14 * DAY_STEPS :][: args.ticks]
    models = [SeasonalNaive(), Holt(), HoltWinters(), MstlHolt()]
    figures = {m.name: time_model(m, history, future) for m in models}
    baseline = time_refit_baseline(history, future[: args.baseline_ticks])
    figures["statsmodels-refit-per-tick"] = baseline
    hw = figures["holt-winters"]["tick_ms_mean"]
    print(f"{'model':<28} {'fit s':>7} {'tick mean ms':>13} {'tick p99 ms':>12}")
    for name, f in figures.items():
        print(
            f"{name:<28} {f.get('fit_s', float('nan')):>7.3f} {f['tick_ms_mean']:>13.3f} "
            f"{f['tick_ms_p99']:>12.3f}"
        )
    speedup = baseline["tick_ms_mean"] / hw
    print(f"holt-winters update+predict is {speedup:,.0f}x cheaper than refitting every tick")
    worst_tick = max(f["tick_ms_p99"] for n, f in figures.items() if n in {m.name for m in models})
    worst_fit = max(f["fit_s"] for n, f in figures.items() if "fit_s" in f)
    print(
        json.dumps(
            {
                "history_steps": int(history.size),
                "step_s": STEP_S,
                "ticks": len(future),
                "models": figures,
                "hw_speedup_over_refit": round(speedup, 1),
                "worst_tick_ms_p99": round(worst_tick, 4),
                "worst_fit_s": round(worst_fit, 3),
                "meets_10ms_p99": worst_tick < 10,
                "meets_2s_fit": worst_fit < 2,
            }
        )
    )


if __name__ == "__main__":
    main()
