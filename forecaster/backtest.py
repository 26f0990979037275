"""Rolling-origin evaluation: how a forecaster would have done, tick by tick, on history.

At every origin the fitted model predicts `horizon` steps, then absorbs the next actual
step with `update`, as the controller's loop will; it is refitted on a schedule from a
sliding window of history. Errors are pooled over all origins and horizons.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from forecaster.conformal import CONFORMAL, BandCalibrator, check_band
from forecaster.models import Forecaster
from forecaster.series import RateSeries
from tidal_base.errors import InvalidInput


@dataclass(frozen=True)
class BacktestSettings:
    horizon_steps: int
    initial_steps: int
    refit_every_steps: int
    history_steps: int
    level: float = 0.9
    band: str = CONFORMAL  # or "analytic": the model's own band

    def __post_init__(self) -> None:
        check_band(self.band)
        if self.horizon_steps < 1:
            raise InvalidInput("horizon must be at least one step")
        if self.initial_steps < 10:
            raise InvalidInput(f"initial history must be >= 10 steps, got {self.initial_steps}")


@dataclass(frozen=True)
class BacktestResult:
    """Pooled errors and timings of one model; `paths` are the last-horizon forecasts."""

    model: str
    mae: float
    smape: float
    coverage: float
    per_horizon_mae: np.ndarray
    update_predict_ms_mean: float
    update_predict_ms_p99: float
    fit_s: float
    fallback: str | None
    conformal_share: float  # origins whose whole horizon had a calibrated band
    times_s: np.ndarray
    actual: np.ndarray
    mean: np.ndarray
    lower: np.ndarray
    upper: np.ndarray


def backtest(model: Forecaster, series: RateSeries, settings: BacktestSettings) -> BacktestResult:
    """Replay `series` from `initial_steps` on; see the module docstring."""
    h, n = settings.horizon_steps, len(series)
    if settings.initial_steps + h > n:
        raise InvalidInput(
            f"series has {n} steps: too short for {settings.initial_steps} of history "
            f"plus a {h}-step horizon"
        )
    origins = range(settings.initial_steps, n - h + 1)
    predictions = np.empty((len(origins), 3, h))
    step_ms, fit_s, fallback, fitted = [], [], None, None
    calibrator = BandCalibrator(h) if settings.band == CONFORMAL else None
    calibrated = 0
    for row, origin in enumerate(origins):
        since = origin - settings.initial_steps
        refit = fitted is None or since % settings.refit_every_steps == 0
        if refit:
            started = time.perf_counter()
            fitted = model.fit(series.slice(max(0, origin - settings.history_steps), origin))
            fit_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        if not refit:
            fitted.update(series.counts[origin - 1 : origin])
        forecast = fitted.predict(h, settings.level)
        if calibrator is not None:
            forecast = _calibrated(calibrator, forecast, series, origin)
            calibrated += forecast.band == CONFORMAL
        if not refit:  # the controller's per-tick cost: update + predict (+ calibrate)
            step_ms.append((time.perf_counter() - started) * 1e3)
        fallback = fallback or forecast.fallback
        predictions[row] = forecast.mean, forecast.lower, forecast.upper
    share = calibrated / len(origins)
    return _score(model, series, settings, origins, predictions, step_ms, fit_s, fallback, share)


def _calibrated(calibrator: BandCalibrator, raw, series: RateSeries, origin: int):
    """Score the step that just closed, file the raw forecast, calibrate it."""
    last = origin - 1
    calibrator.observe(series.start_s + last * series.step_s, float(series.counts[last]))
    calibrator.record(raw)
    return calibrator.calibrate(raw)


def _score(model, series, settings, origins, predictions, step_ms, fit_s, fallback, share):
    h = settings.horizon_steps
    index = np.arange(origins.start, origins.stop)[:, None] + np.arange(h)[None, :]
    actual = series.counts[index]
    mean, lower, upper = predictions[:, 0], predictions[:, 1], predictions[:, 2]
    valid = ~np.isnan(actual)
    error = np.abs(mean - actual)
    denominator = np.abs(mean) + np.abs(actual)
    smape = np.where(denominator > 0, 2 * error / np.where(denominator > 0, denominator, 1), 0.0)
    covered = (actual >= lower) & (actual <= upper)
    last = h - 1
    return BacktestResult(
        model=model.name,
        mae=float(error[valid].mean()),
        smape=float(smape[valid].mean()),
        coverage=float(covered[valid].mean()),
        per_horizon_mae=np.nanmean(np.where(valid, error, np.nan), axis=0),
        update_predict_ms_mean=float(np.mean(step_ms)) if step_ms else 0.0,
        update_predict_ms_p99=float(np.percentile(step_ms, 99)) if step_ms else 0.0,
        fit_s=float(np.mean(fit_s)),
        fallback=fallback,
        conformal_share=share,
        times_s=series.start_s + series.step_s * index[:, last],
        actual=actual[:, last],
        mean=mean[:, last],
        lower=lower[:, last],
        upper=upper[:, last],
    )
