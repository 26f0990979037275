"""Forecaster specs (`holt-winters:seasonal=mul`, `seasonal-naive:period=1w`, `auto`)
and the `auto` model that picks per series by rolling backtest error.

The statsmodels-backed models (`forecaster.smoothing`) are imported only when a spec
builds one, so parsing and checking specs, and seasonal-naive, stay light.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

from forecaster.forecast import Forecast
from forecaster.models import DAY_S, FittedForecaster, Forecaster, SeasonalNaive
from forecaster.series import RateSeries
from tidal_base.errors import InvalidInput
from tidal_base.specs import parse_spec
from tidal_base.units import parse_duration_s

MODEL_OPTIONS = {
    "seasonal-naive": ("period", "rescale"),
    "holt": (),
    "holt-winters": ("seasonal", "period"),
    "mstl": (),
    "auto": (),
}
"""Each forecaster's name in specs and the options it takes."""
MODEL_NAMES = tuple(MODEL_OPTIONS)


def build_forecaster(text: str) -> Forecaster:
    """A forecaster from its spec; errors name the spec and the option."""
    spec = parse_spec(text, kind="forecaster")  # the same NAME:KEY=VALUE grammar as policies
    options = dict(spec.options)

    def take_duration(key: str, default: float) -> float:
        return parse_duration_s(options.pop(key), field=key) if key in options else default

    if spec.name == "seasonal-naive":
        period_s = take_duration("period", DAY_S)
        model: Forecaster = SeasonalNaive(period_s, take_duration("rescale", 0.0))
    elif spec.name not in MODEL_NAMES:
        raise InvalidInput(f"unknown forecaster {spec.name!r} (known: {', '.join(MODEL_NAMES)})")
    elif spec.name == "holt-winters":
        seasonal = options.pop("seasonal", "add")
        if seasonal not in ("add", "mul"):
            raise InvalidInput(f"forecaster {text!r}: seasonal must be add or mul")
        period_s = take_duration("period", DAY_S)
        model = _smoothing().HoltWinters(period_s, seasonal == "mul")
    elif spec.name == "holt":
        model = _smoothing().Holt()
    elif spec.name == "mstl":
        model = _smoothing().MstlHolt()
    else:
        model = Auto()
    if options:
        known = ", ".join(MODEL_OPTIONS[spec.name]) or f"{spec.name} takes none"
        raise InvalidInput(
            f"forecaster {text!r}: unknown option {sorted(options)[0]!r} (known: {known})"
        )
    return model


def _smoothing() -> ModuleType:
    """`forecaster.smoothing`, imported on first use: it loads statsmodels (about 1 s)."""
    from forecaster import smoothing

    return smoothing


def _default_candidates() -> tuple[Forecaster, ...]:
    smoothing = _smoothing()
    return (SeasonalNaive(), smoothing.Holt(), smoothing.HoltWinters(), smoothing.MstlHolt())


@dataclass(frozen=True)
class Auto:
    """Fits every candidate on all but the last part of the history, replays that part
    with update + predict, and keeps the candidate with the lowest error."""

    candidates: tuple[Forecaster, ...] = field(default_factory=_default_candidates)
    horizon_steps: int = 10
    name: str = "auto"

    def fit(self, series: RateSeries) -> FittedForecaster:
        holdout = min(max(len(series) // 5, self.horizon_steps * 5), len(series) // 2)
        train = series.slice(0, len(series) - holdout)
        errors = {
            m.name: _replay_error(m, train, series.counts[-holdout:], self.horizon_steps)
            for m in self.candidates
        }
        best = min(self.candidates, key=lambda m: errors[m.name])
        return _Picked(best.fit(series), f"auto: {best.name}", errors)


def _replay_error(model: Forecaster, train: RateSeries, future: np.ndarray, horizon: int) -> float:
    fitted = model.fit(train)
    errors = []
    for i in range(0, future.size - horizon, max(1, horizon // 2)):
        forecast = fitted.predict(horizon)
        errors.append(np.nanmean(np.abs(forecast.mean - future[i : i + horizon])))
        fitted.update(future[i : i + max(1, horizon // 2)])
    return float(np.mean(errors)) if errors else float("inf")


@dataclass
class _Picked:
    inner: FittedForecaster
    name: str
    errors: dict[str, float]

    def update(self, values: np.ndarray) -> None:
        self.inner.update(values)

    def predict(self, steps: int, level: float = 0.9) -> Forecast:
        forecast = self.inner.predict(steps, level)
        return Forecast(
            forecast.times_s,
            forecast.step_s,
            forecast.mean,
            forecast.lower,
            forecast.upper,
            forecast.level,
            self.name,
            forecast.fitted_at_s,
            forecast.fallback,
            forecast.events,
        )
