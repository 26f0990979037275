"""Holt, Holt-Winters and MSTL: the forecasters that fit with statsmodels.

The only module of Tidal that imports statsmodels (importing it costs about a second),
so `forecaster.registry` imports it only when it builds one of these. statsmodels fits
the parameters and the initial states (`fit`); the fitted objects then carry the
smoothing recursions themselves, so `update` costs microseconds per point and `predict`
a few vector operations, cheap enough for every control tick. Intervals are the analytic
ones of the additive ETS models (Hyndman et al., class 1).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
from statsmodels.tsa.holtwinters import ExponentialSmoothing
from statsmodels.tsa.seasonal import MSTL

from forecaster.forecast import Forecast
from forecaster.models import DAY_S, WEEK_S, StepClock, clock_after, z_score
from forecaster.series import RateSeries, fill_gaps
from tidal_base.errors import InvalidInput


@dataclass
class SmoothingState:
    """Damped-trend exponential smoothing, optionally seasonal (additive or multiplicative).

    Component form as statsmodels' ExponentialSmoothing states it; `season` holds the
    last `m` seasonal states, `season[position]` being the one the next step uses.
    """

    alpha: float
    beta: float
    gamma: float
    phi: float
    level: float
    trend: float
    season: np.ndarray
    multiplicative: bool
    sigma: float
    position: int = 0

    def step(self, y: float) -> None:
        m = self.season.size
        s = self.season[self.position] if m else (1.0 if self.multiplicative else 0.0)
        base = self.level + self.phi * self.trend
        if math.isnan(y):
            y = base * s if self.multiplicative else base + s
        deseasoned = y / s if self.multiplicative else y - s
        level = self.alpha * deseasoned + (1 - self.alpha) * base
        self.trend = self.beta * (level - self.level) + (1 - self.beta) * self.phi * self.trend
        if m:
            ratio = y / base if self.multiplicative else y - base
            self.season[self.position] = self.gamma * ratio + (1 - self.gamma) * s
            self.position = (self.position + 1) % m
        self.level = level

    def mean(self, steps: int) -> np.ndarray:
        ahead = np.arange(1, steps + 1)
        damped = np.cumsum(self.phi**ahead)
        base = self.level + damped * self.trend
        if not self.season.size:
            return base
        s = self.season[(self.position + ahead - 1) % self.season.size]
        return base * s if self.multiplicative else base + s

    def spread(self, steps: int, z: float) -> np.ndarray:
        """z times the h-step forecast standard deviation, h = 1..steps."""
        j = np.arange(1, steps)
        damped = np.cumsum(self.phi**j)
        c = self.alpha * (1 + self.beta * damped)
        if self.season.size:
            c = c + self.gamma * (1 - self.alpha) * (j % self.season.size == 0)
        variance = np.concatenate(([1.0], 1.0 + np.cumsum(c * c)))
        return z * self.sigma * np.sqrt(variance)


def fit_smoothing(values: np.ndarray, period: int, multiplicative: bool) -> SmoothingState:
    """Fit a damped-trend (seasonal when period > 1) model with statsmodels."""
    seasonal = ("mul" if multiplicative else "add") if period > 1 else None
    model = ExponentialSmoothing(
        values,
        trend="add",
        damped_trend=True,
        seasonal=seasonal,
        seasonal_periods=period if seasonal else None,
        initialization_method="heuristic" if seasonal else "estimated",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence chatter; the fit is checked below
        result = model.fit(use_brute=False)
    params = result.params
    residuals = values - result.fittedvalues
    return SmoothingState(
        alpha=float(params["smoothing_level"]),
        beta=float(params["smoothing_trend"]),
        gamma=float(params.get("smoothing_seasonal") or 0.0) if seasonal else 0.0,
        phi=float(params["damping_trend"]),
        level=float(result.level[-1]),
        trend=float(result.trend[-1]),
        season=np.asarray(result.season[-period:], dtype=np.float64).copy()
        if seasonal
        else np.zeros(0),
        multiplicative=multiplicative and seasonal is not None,
        sigma=float(np.std(residuals)),
    )


@dataclass
class FittedSmoothing:
    """Holt or Holt-Winters after fitting; also the remainder model of MSTL."""

    name: str
    clock: StepClock
    state: SmoothingState
    fallback: str | None = None
    profile: np.ndarray = field(default_factory=lambda: np.zeros(0))
    profile_position: int = 0

    def update(self, values: np.ndarray) -> None:
        for value in values:
            self.state.step(value - self._seasonal_now() if self.profile.size else value)
            if self.profile.size:
                self.profile_position = (self.profile_position + 1) % self.profile.size
        self.clock.advance(len(values))

    def _seasonal_now(self) -> float:
        return float(self.profile[self.profile_position])

    def predict(self, steps: int, level: float = 0.9) -> Forecast:
        mean = self.state.mean(steps)
        if self.profile.size:
            phases = (self.profile_position + np.arange(steps)) % self.profile.size
            mean = mean + self.profile[phases]
        spread = self.state.spread(steps, z_score(level))
        return self.clock.forecast(mean, spread, level, self.name, self.fallback)


@dataclass(frozen=True)
class Holt:
    """Level and damped trend, no season."""

    name: str = "holt"

    def fit(self, series: RateSeries) -> FittedSmoothing:
        values, _ = fill_gaps(series.counts.astype(np.float64))
        if values.size < 10:
            raise InvalidInput(f"holt needs at least 10 points of history, got {values.size}")
        return FittedSmoothing(self.name, clock_after(series), fit_smoothing(values, 1, False))


@dataclass(frozen=True)
class HoltWinters:
    """Level, damped trend and a daily season, additive or multiplicative."""

    period_s: float = DAY_S
    multiplicative: bool = False
    name: str = "holt-winters"

    def fit(self, series: RateSeries) -> FittedSmoothing:
        values, _ = fill_gaps(series.counts.astype(np.float64))
        period = series.steps_per(self.period_s)
        if values.size < 2 * period or period < 2:
            fitted = Holt(self.name).fit(series)
            fitted.fallback = f"holt: history shorter than two {self.period_s:g}s seasons"
            return fitted
        multiplicative = self.multiplicative and bool(np.all(values > 0))
        state = fit_smoothing(values, period, multiplicative)
        return FittedSmoothing(self.name, clock_after(series), state)


@dataclass(frozen=True)
class MstlHolt:
    """Daily and weekly seasons by MSTL, the rest (trend + remainder) by damped Holt.

    MSTL runs on a coarsened copy (at most ~4,000 points) so a two-week history at a
    one-minute step fits in about a second; seasonal shapes are smooth, so their
    interpolation back to the fine step loses little.
    """

    periods_s: tuple[float, ...] = (DAY_S, WEEK_S)
    max_points: int = 4000
    name: str = "mstl"

    def fit(self, series: RateSeries) -> FittedSmoothing:
        values, _ = fill_gaps(series.counts.astype(np.float64))
        periods = [series.steps_per(p) for p in self.periods_s]
        # MSTL needs more than two full cycles of a season to estimate it.
        usable = [p for p in periods if p >= 2 and values.size > 2 * p + max(periods) // 50]
        if not usable:
            fitted = Holt(self.name).fit(series)
            fitted.fallback = "holt: history not longer than two daily seasons"
            return fitted
        profile = _seasonal_profile(values, usable, self.max_points)
        # Phase 0 of the profile is the step right after the history.
        phases = (np.arange(values.size) - values.size) % profile.size
        state = fit_smoothing(values - profile[phases], 1, False)
        fallback = None
        if len(usable) < len(periods):
            fallback = "mstl with the daily season only: history not longer than two weeks"
        return FittedSmoothing(self.name, clock_after(series), state, fallback, profile)


def _seasonal_profile(values: np.ndarray, periods: list[int], max_points: int) -> np.ndarray:
    """The summed seasonal components over the longest period; index 0 is the next step.

    Each component's last full cycle covers the final `period` steps of the history, so
    the step after the history is phase 0 of every component.
    """
    factor = _coarsening(periods, values.size, max_points)
    coarse_len = values.size // factor
    coarse = values[values.size - coarse_len * factor :].reshape(coarse_len, factor).mean(axis=1)
    result = MSTL(coarse, periods=[p // factor for p in periods]).fit()
    components = np.asarray(result.seasonal).reshape(coarse_len, -1)
    longest = max(periods)
    phase = np.arange(longest)
    profile = np.zeros(longest)
    for column, period in enumerate(periods):
        cycle = components[-(period // factor) :, column]
        # Coarse point k averages fine steps [k*f, (k+1)*f): its centre is k*f + (f-1)/2.
        centres = np.arange(cycle.size) * factor + (factor - 1) / 2
        profile += np.interp(phase % period, centres, cycle, period=period)
    return profile


MAX_PERIOD_POINTS = 336
"""MSTL's LOESS cost grows with the period: keep the longest under a week of 30-min steps."""


def _coarsening(periods: list[int], length: int, max_points: int) -> int:
    """The smallest factor dividing every period that shrinks the series and its longest
    season enough for MSTL to fit in about a second."""
    base = math.gcd(*periods)
    for factor in range(1, base + 1):
        small_enough = length / factor <= max_points and max(periods) / factor <= MAX_PERIOD_POINTS
        if base % factor == 0 and small_enough:
            return factor
    return base
