"""Forecast bands that mean what they say: split-conformal calibration per horizon.

A model's analytic band assumes its own error model (Holt's damped-trend variance, a
seasonal-naive difference's spread); on real traffic that band covers too much a day
ahead and too little an hour ahead. `BandCalibrator` watches the forecasts actually
made and the counts that then arrived, and keeps, per horizon, the recent scores
`(actual - mean) / scale`, where `scale` is the analytic band's upper half-width (never
below the Poisson noise of the mean). A calibrated band at level L is then
`mean + q * scale` with q the scores' (1-L)/2 and (1+L)/2 quantiles, at ranks with the
split-conformal finite-sample correction, so a nominal 90% band covers about 90% out of
sample whatever the model's own error model says.

Scores come only from forecasts made before their actuals arrived (out of sample), and
the calibrator outlives refits: a refitted model inherits the recent scores of the one
it replaces. A horizon with fewer than `min_scores` scores keeps the analytic band, and
the forecast's `band` says which is in use.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from forecaster.forecast import Forecast
from tidal_base.errors import InvalidInput

ANALYTIC = "analytic"
CONFORMAL = "conformal"
BANDS = (CONFORMAL, ANALYTIC)


def check_band(band: str) -> str:
    """`band` if it names a band kind, else the `InvalidInput` that says which exist."""
    if band not in BANDS:
        raise InvalidInput(f"band must be conformal or analytic, got {band!r}")
    return band


class BandCalibrator:
    """Per-horizon scores of past forecasts; see the module docstring.

    `record(forecast)` files a raw forecast under the step it starts at; `observe(t, n)`
    scores every filed forecast against the count `n` of the step starting at `t`;
    `calibrate(forecast)` returns the forecast with its band calibrated where enough
    scores exist. Steps are identified by their start time on the forecast's step grid.
    """

    def __init__(self, horizon_steps: int, *, window: int = 1000, min_scores: int = 30) -> None:
        if horizon_steps < 1 or window < 2 or not 2 <= min_scores <= window:
            raise InvalidInput(
                f"calibrator needs horizon >= 1 and 2 <= min_scores <= window, got "
                f"{horizon_steps}, {min_scores}, {window}"
            )
        self.horizon_steps = horizon_steps
        self.min_scores = min_scores
        # A ring of scores per horizon: row h holds the last `window` scores at h steps.
        self._scores = np.full((horizon_steps, window), np.nan)
        self._count = np.zeros(horizon_steps, dtype=np.int64)
        self._filed: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # step -> (mean, scale)
        self._grid: tuple[float, float] | None = None  # (first step's start, step_s)
        self._quantiles: dict[float, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def scores_per_horizon(self) -> np.ndarray:
        """How many scores each horizon holds (at most the window)."""
        return np.minimum(self._count, self._scores.shape[1])

    def record(self, forecast: Forecast) -> None:
        """File a raw (uncalibrated) forecast, to be scored as its steps arrive."""
        step = self._step_of(forecast.times_s[0], forecast.step_s)
        h = min(self.horizon_steps, forecast.mean.size)
        mean = np.asarray(forecast.mean[:h], dtype=np.float64)
        self._filed[step] = (mean, _scale(mean, np.asarray(forecast.upper[:h])))

    def observe(self, start_s: float, count: float) -> None:
        """The count of the step starting at `start_s` arrived: score what predicted it."""
        if self._grid is None or math.isnan(count):
            return
        step = self._step_of(start_s, self._grid[1])
        for origin in [o for o in self._filed if o <= step - self.horizon_steps]:
            del self._filed[origin]  # every step it predicted has been scored
        for origin, (mean, scale) in self._filed.items():
            ahead = step - origin
            if 0 <= ahead < mean.size:
                row = self._scores[ahead]
                row[self._count[ahead] % row.size] = (count - mean[ahead]) / scale[ahead]
                self._count[ahead] += 1
        self._quantiles.clear()

    def calibrate(self, forecast: Forecast) -> Forecast:
        """`forecast` with a conformal band on every horizon that has enough scores."""
        h = min(self.horizon_steps, forecast.mean.size)
        ready = self.scores_per_horizon[:h] >= self.min_scores
        if not ready.any():
            return replace(forecast, band=self._analytic_reason(h))
        low_q, high_q = self._score_quantiles(forecast.level)
        mean = np.asarray(forecast.mean, dtype=np.float64)
        scale = _scale(mean[:h], np.asarray(forecast.upper[:h]))
        lower, upper = forecast.lower.astype(np.float64), forecast.upper.astype(np.float64)
        calibrated_lower = np.minimum(mean[:h] + low_q[:h] * scale, mean[:h])
        calibrated_upper = np.maximum(mean[:h] + high_q[:h] * scale, mean[:h])
        lower[:h] = np.where(ready, np.maximum(calibrated_lower, 0.0), lower[:h])
        upper[:h] = np.where(ready, calibrated_upper, upper[:h])
        return replace(forecast, lower=lower, upper=upper, band=self._band_name(ready, h))

    def _step_of(self, start_s: float, step_s: float) -> int:
        if self._grid is None:
            self._grid = (start_s, step_s)
        first_s, grid_step_s = self._grid
        if not math.isclose(step_s, grid_step_s):
            raise InvalidInput(f"calibrator steps are {grid_step_s} s, got a {step_s} s forecast")
        return round((start_s - first_s) / grid_step_s)

    def _score_quantiles(self, level: float) -> tuple[np.ndarray, np.ndarray]:
        """Per horizon, the scores at ranks floor((n+1)(1-L)/2) and ceil((n+1)(1+L)/2)."""
        if level not in self._quantiles:
            n = self.scores_per_horizon
            ordered = np.sort(self._scores, axis=1)  # NaN (unfilled) sorts last
            low_rank = np.clip(np.floor((n + 1) * (1 - level) / 2).astype(int), 1, None)
            high_rank = np.minimum(np.ceil((n + 1) * (1 + level) / 2).astype(int), n)
            rows = np.arange(n.size)
            low = ordered[rows, np.clip(low_rank - 1, 0, None)]
            high = ordered[rows, np.clip(high_rank - 1, 0, None)]
            self._quantiles[level] = (low, high)
        return self._quantiles[level]

    def _analytic_reason(self, h: int) -> str:
        have = int(self.scores_per_horizon[:h].min())
        return f"{ANALYTIC}: {have} of {self.min_scores} residuals needed to calibrate"

    def _band_name(self, ready: np.ndarray, h: int) -> str:
        if ready.all():
            return CONFORMAL
        first = int(np.argmin(ready))
        return f"{CONFORMAL} to {first} steps ahead, {ANALYTIC} beyond (too few residuals)"


def _scale(mean: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """The analytic band's upper half-width, never below the Poisson noise of the mean."""
    return np.maximum(upper - mean, np.sqrt(np.maximum(mean, 1.0)))
