"""The forecasting model seam (`Forecaster`, `FittedForecaster`, `StepClock`) and the
seasonal-naive baseline.

This module does not import statsmodels, so the core and the live shells can hold a
forecaster, and forecast seasonal-naive, without loading it; Holt, Holt-Winters and
MSTL, which fit with statsmodels, live in `forecaster.smoothing`.

Short or gappy histories never crash: a model that needs more history falls back to a
simpler one and says so in `Forecast.fallback`; NaNs are interpolated when fitting and
replaced by the model's own prediction when updating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Protocol

import numpy as np

from forecaster.forecast import Forecast
from forecaster.series import RateSeries, fill_gaps
from tidal_base.errors import InvalidInput

DAY_S = 86_400.0
WEEK_S = 7 * DAY_S


class FittedForecaster(Protocol):
    """A fitted model: absorbs new points, predicts ahead."""

    name: str

    def update(self, values: np.ndarray) -> None:
        """Absorb the next observations (requests per step; NaN for a gap)."""
        ...

    def predict(self, steps: int, level: float = 0.9) -> Forecast: ...


class Forecaster(Protocol):
    """A model specification; `fit` returns a new fitted object."""

    name: str

    def fit(self, series: RateSeries) -> FittedForecaster: ...


def z_score(level: float) -> float:
    """The two-sided normal quantile of an interval level (0.9 -> 1.645)."""
    if not 0 < level < 1:
        raise InvalidInput(f"interval level must be in (0, 1), got {level}")
    return NormalDist().inv_cdf(0.5 + level / 2)


@dataclass
class StepClock:
    """Where a fitted model is in time: the start of the next step it will see."""

    next_time_s: float
    step_s: float
    fitted_at_s: float

    def advance(self, steps: int) -> None:
        self.next_time_s += steps * self.step_s

    def ahead(self, steps: int) -> np.ndarray:
        return self.next_time_s + self.step_s * np.arange(steps)

    def forecast(
        self, mean: np.ndarray, spread: np.ndarray, level: float, model: str, fallback: str | None
    ) -> Forecast:
        """A symmetric band of +-spread around mean, starting at the next step."""
        times = self.ahead(mean.size)
        return Forecast(
            times,
            self.step_s,
            mean,
            mean - spread,
            mean + spread,
            level,
            model,
            self.fitted_at_s,
            fallback,
        ).clipped()


def clock_after(series: RateSeries) -> StepClock:
    """A clock at the step right after the series ends, fitted at that instant."""
    end = series.start_s + len(series) * series.step_s
    return StepClock(end, series.step_s, end)


# --- seasonal naive ---------------------------------------------------------------


@dataclass(frozen=True)
class SeasonalNaive:
    """Tomorrow looks like today: the value one season ago (naive with no full season).

    With `rescale_s` > 0, tomorrow has today's shape at the level of the last
    `rescale_s`: the season-ago values times the ratio of the last `rescale_s` of history
    to the same span one season before. A day's rises (the 05:30 step of a city's
    traffic) come when they came yesterday, at the height today's load has run at,
    where a plain seasonal naive repeats yesterday's level and Holt repeats the last
    hour's and misses the step."""

    period_s: float = DAY_S
    rescale_s: float = 0.0
    name: str = "seasonal-naive"

    def __post_init__(self) -> None:
        if not 0 <= self.rescale_s < self.period_s:
            raise InvalidInput(
                f"seasonal-naive: rescale must be in [0, period ({self.period_s:g}s)), "
                f"got {self.rescale_s:g}s"
            )

    def fit(self, series: RateSeries) -> FittedSeasonalNaive | FittedRescaledNaive:
        values, _ = fill_gaps(series.counts.astype(np.float64))
        period = series.steps_per(self.period_s)
        window = series.steps_per(self.rescale_s) if self.rescale_s > 0 else 0
        if window and values.size >= period + window:
            return FittedRescaledNaive.fitted(
                self.name, clock_after(series), values, period, window
            )
        fallback = None
        if window:
            fallback = (
                f"not rescaled: history shorter than one {self.period_s:g}s season "
                f"and {self.rescale_s:g}s"
            )
        if values.size < period + 1:
            fallback = f"naive (last value): history shorter than one {self.period_s:g}s season"
            period = 1
        diffs = values[period:] - values[:-period] if values.size > period else np.zeros(1)
        sigma = float(np.std(diffs)) if diffs.size > 1 else float(abs(values[-1]) ** 0.5)
        return FittedSeasonalNaive(
            self.name, clock_after(series), values[-period:].copy(), sigma, fallback
        )


@dataclass
class FittedSeasonalNaive:
    name: str
    clock: StepClock
    last_season: np.ndarray
    sigma: float
    fallback: str | None
    position: int = 0

    def update(self, values: np.ndarray) -> None:
        period = self.last_season.size
        for value in values:
            if not math.isnan(value):
                self.last_season[self.position] = value
            self.position = (self.position + 1) % period
        self.clock.advance(len(values))

    def predict(self, steps: int, level: float = 0.9) -> Forecast:
        period = self.last_season.size
        ahead = np.arange(steps)
        mean = self.last_season[(self.position + ahead) % period]
        spread = z_score(level) * self.sigma * np.sqrt(ahead // period + 1)
        return self.clock.forecast(mean, spread, level, self.name, self.fallback)


@dataclass
class FittedRescaledNaive:
    """The last season and `window` steps before it, in a ring (`start`: the oldest)."""

    name: str
    clock: StepClock
    ring: np.ndarray
    period: int
    window: int
    sigma: float
    start: int = 0

    @classmethod
    def fitted(
        cls, name: str, clock: StepClock, values: np.ndarray, period: int, window: int
    ) -> FittedRescaledNaive:
        # The spread: how far each step fell from the season-ago value rescaled by the
        # level ratio as it stood just before it (running sums over the history).
        sums = np.concatenate(([0.0], np.cumsum(values)))
        t = np.arange(period + window, values.size)
        recent = sums[t] - sums[t - window]
        before = sums[t - period] - sums[t - period - window]
        ratio = np.divide(recent, before, out=np.ones_like(recent), where=before > 0)
        errors = values[t] - ratio * values[t - period]
        sigma = float(np.std(errors)) if errors.size > 1 else float(abs(values[-1]) ** 0.5)
        ring = values[-(period + window) :].copy()
        return cls(name, clock, ring, period, window, sigma)

    def update(self, values: np.ndarray) -> None:
        size = self.ring.size
        for value in values:
            if math.isnan(value):  # a gap: what the model expected there
                value = float(self.predict(1).mean[0])
            self.ring[self.start] = value
            self.start = (self.start + 1) % size
            self.clock.advance(1)

    def level_ratio(self) -> float:
        """The last `window` steps over the same steps one season before (1 if idle)."""
        size = self.ring.size
        span = np.arange(self.window)
        before = float(self.ring[(self.start + span) % size].sum())
        recent = float(self.ring[(self.start + self.period + span) % size].sum())
        return recent / before if before > 0 else 1.0

    def predict(self, steps: int, level: float = 0.9) -> Forecast:
        ahead = np.arange(steps)
        # Step k ahead is step k of the last season, which starts `window` in the ring.
        season = self.ring[(self.start + self.window + ahead % self.period) % self.ring.size]
        mean = season * self.level_ratio()
        spread = z_score(level) * self.sigma * np.sqrt(ahead // self.period + 1)
        return self.clock.forecast(mean, spread, level, self.name, None)
