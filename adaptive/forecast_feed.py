"""The controller's view of future load: a fitted forecaster fed by observed arrivals.

Arrivals observed each tick are summed into fixed forecast steps. At every step the
fitted model absorbs the new count (cheap recursions) and predicts the horizon the
policy asked for; every `refit_s` it is refitted on the recent history and swapped in
whole (fitting returns a new object). Until the model has enough history it stands in
a last-value forecast, and says so in the forecast's `fallback`.

The band is calibrated on the model's own recent errors per horizon
(`forecaster.conformal`) once enough forecasts have met their actuals, and the
calibration outlives refits; the oracle, which knows the future, and the stand-in keep
their own band.

A refit that fails (statsmodels' `ValueError` or `LinAlgError` on a degenerate history)
is an outcome, not a crash: the feed keeps the last good fit (or the stand-in), counts
the failure (`fit_failures`, `last_fit_error`), and tries again after a backoff that
doubles from one step up to `refit_s`, in the simulator (fits inline) and live (fits on
a thread) alike.

The feed also scores the forecast: each step's actual count is checked against the band
predicted for it one step earlier, and `outside_band_s` says how long actual load has
run outside the band: the controller's trigger to fall back to a reactive policy.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from forecaster.conformal import CONFORMAL, BandCalibrator, check_band
from forecaster.events import Event, EventAware, FittedEventAware
from forecaster.forecast import Forecast
from forecaster.known import KnownFuture
from forecaster.models import FittedForecaster, Forecaster, SeasonalNaive
from forecaster.series import RateSeries
from tidal_base.errors import InvalidInput


@dataclass(frozen=True)
class FitFailed:
    """A fit that raised: the model could not be fitted on this history (a singular
    matrix, a degenerate series). The feed keeps forecasting with what it has."""

    error: Exception

    def describe(self) -> str:
        """The error in one line, e.g. "LinAlgError: Singular matrix"."""
        return f"{type(self.error).__name__}: {self.error}"


FitOutcome = FittedForecaster | InvalidInput | FitFailed
"""What a fit ends in: a fitted model, the `InvalidInput` that says why the model cannot
fit yet (too little history: the stand-in forecasts), or a failure."""


@dataclass(frozen=True)
class FitJob:
    """A refit the feed wants: `run()` fits `model` on `series` (seconds of CPU for MSTL
    on days of history), anywhere, and returns its `FitOutcome`; it never raises.
    `ForecastFeed.install` takes the outcome back."""

    model: Forecaster
    series: RateSeries
    end_s: float
    closed_steps: int  # the feed's closed steps when the series was cut

    def run(self) -> FitOutcome:
        """Fit `model` on `series`; the fitted model, the `InvalidInput` that says why it
        cannot fit yet, or the `FitFailed` of any other error. Never raises."""
        try:
            return self.model.fit(self.series)
        except InvalidInput as error:
            return error
        except Exception as error:  # a model's own failure (LinAlgError...) is an outcome
            return FitFailed(error)


class ForecastFeed:
    """Observed arrivals in, the current `Forecast` out.

    With `defer_fits`, refits of the model are not run inside `observe`: the feed hands
    them out as a `FitJob` (`take_fit_job`), keeps forecasting with the model it has,
    and installs the new one when the shell gives it back (`install`), caught up on the
    steps that closed meanwhile. The live control loop runs them on a thread; the
    simulator fits inline, where a tick may take as long as it needs.

    forecaster: the model to fit; step_s: the forecast step (arrivals are summed per
    step); horizon_s: how far ahead to predict; origin_s: the Unix time of clock zero;
    events: declared events the model forecasts with (None: the model is not event
    aware, as the oracle); level: the band's coverage; history_s: how much history a
    refit sees; refit_s: how often to refit; min_history_s: the history below which the
    last value stands in; defer_fits: hand refits out as jobs instead of fitting inline;
    band: how the band is made ("conformal": calibrated on the model's own errors).
    """

    def __init__(
        self,
        forecaster: Forecaster,
        *,
        step_s: float,
        horizon_s: float,
        origin_s: float = 0.0,
        events: tuple[Event, ...] | None = None,
        level: float = 0.9,
        history_s: float = 6 * 3600.0,
        refit_s: float = 1800.0,
        min_history_s: float = 1800.0,
        defer_fits: bool = False,
        band: str = CONFORMAL,
    ) -> None:
        if step_s <= 0 or horizon_s <= 0:
            raise InvalidInput(f"forecast step and horizon must be > 0, got {step_s}, {horizon_s}")
        self.step_s = step_s
        self.origin_s = origin_s
        self.level = level
        self.refit_s = refit_s
        # Parameters fitted on a few minutes are noise; the last value is the safer guess.
        self.min_history_steps = round(min_history_s / step_s)
        self.horizon_steps = math.ceil(horizon_s / step_s) + 1
        # `events=None`: the model is not event-aware at all (the oracle knows the future).
        self._inner = forecaster
        self._model: Forecaster = forecaster if events is None else EventAware(forecaster, events)
        self._model_needs_no_history = isinstance(forecaster, KnownFuture)
        calibrate = check_band(band) == CONFORMAL and not self._model_needs_no_history
        self._calibrator = BandCalibrator(self.horizon_steps) if calibrate else None
        self._stand_in: Forecaster = EventAware(SeasonalNaive(step_s), events or ())
        self._history: deque[float] = deque(maxlen=max(1, round(history_s / step_s)))
        self._fitted: FittedForecaster | None = None
        self._fitted_at = -math.inf
        self._stand_in_reason: str | None = None
        self._step_end = step_s
        self._pending = 0.0
        self._outside_since: float | None = None
        self._tried_empty = False
        self._scored_stand_in = False
        self.forecast: Forecast | None = None
        self.history_s = history_s
        self.defer_fits = defer_fits
        self._job: FitJob | None = None  # wanted, not yet taken
        self._taken: FitJob | None = None  # taken by the shell, not yet installed
        self._closed_steps = 0
        self.steps_scored = 0
        self.steps_outside = 0
        self.last_error_rps: float | None = None  # actual - forecast mean, last step scored
        self.fits = 0  # fits installed (the first included)
        self.fit_failures = 0  # fits that raised, in all
        self.last_fit_error: str | None = None  # the last failure's, until a fit succeeds
        self._failed_in_a_row = 0
        self._retry_at = -math.inf  # no fit is tried before this (backoff after failures)

    def observe(self, now: float, arrivals: int) -> Forecast | None:
        """Count this tick's arrivals; at a step boundary, update and predict."""
        self._pending += arrivals
        if not self._tried_empty:
            self._tried_empty = True
            self._try_fit(0.0)  # a model that needs no history (the oracle) starts at once
            if self._fitted is None and arrivals:
                self._start_from_first_tick(now, arrivals)
            if self._fitted is not None:
                self.forecast = self._predict()
        if now + 1e-9 < self._step_end:
            return self.forecast
        count, self._pending = self._pending, 0.0
        while now + 1e-9 >= self._step_end:
            self._close_step(count, self._step_end)
            count = 0.0
            self._step_end += self.step_s
        return self.forecast

    def set_events(self, events: tuple[Event, ...]) -> None:
        """Declared events changed (the operator API): forecast with them from now on.

        The fitted model keeps its state; only the lift it applies changes, and the next
        refit de-lifts the history with the new events."""
        if not isinstance(self._model, EventAware):
            return
        self._model = EventAware(self._inner, events)
        self._stand_in = EventAware(SeasonalNaive(self.step_s), events)
        if isinstance(self._fitted, FittedEventAware):
            self._fitted.events = events
            self.forecast = self._predict()

    def prime(self, counts_per_second: np.ndarray, now: float) -> None:
        """Start from recorded traffic (per-second arrivals up to `now`, a restart's
        history from the bus) instead of an empty history."""
        per_step = max(1, round(self.step_s))
        steps = len(counts_per_second) // per_step
        if steps == 0:
            return
        recent = np.asarray(counts_per_second[len(counts_per_second) - steps * per_step :])
        self._history.extend(recent.reshape(steps, per_step).sum(axis=1) * self.step_s / per_step)
        self._step_end = now + self.step_s
        self._tried_empty = True
        self._try_fit(now)
        if self._fitted is not None:
            self.forecast = self._predict()

    def outside_band_s(self, now: float) -> float:
        """How long actual load has run outside the forecast band (0 while inside)."""
        return 0.0 if self._outside_since is None else now - self._outside_since

    @property
    def history(self) -> RateSeries:
        """The closed steps' counts as a series (Unix times), oldest first."""
        start = self._step_end - self.step_s * (len(self._history) + 1)
        return RateSeries(self.origin_s + start, self.step_s, np.array(self._history))

    def take_fit_job(self) -> FitJob | None:
        """The refit the feed wants run, if any (deferred fits only); one at a time."""
        job, self._job = self._job, None
        if job is not None:
            self._taken = job
        return job

    def install(self, job: FitJob, outcome: FitOutcome) -> None:
        """Take a finished refit back: catch it up on the steps closed since its series
        was cut and forecast with it (if it could not fit yet, with the stand-in; if it
        failed, with what the feed had, trying again after a backoff)."""
        self._taken = None
        if isinstance(outcome, FitFailed):
            self._fit_failed(job.end_s, outcome)
            return
        if isinstance(outcome, InvalidInput):
            self._use_stand_in(self._series(self._step_end - self.step_s), outcome)
            return
        missed = self._closed_steps - job.closed_steps
        if missed:
            outcome.update(np.array(list(self._history)[-missed:]))
        if isinstance(outcome, FittedEventAware) and isinstance(self._model, EventAware):
            outcome.events = self._model.events  # events may have changed meanwhile
        self._fitted_with(outcome, job.end_s)
        self.forecast = self._predict()

    def _fitted_with(self, fitted: FittedForecaster, end_s: float) -> None:
        self._fitted, self._stand_in_reason, self._fitted_at = fitted, None, end_s
        self.fits += 1
        self._failed_in_a_row, self.last_fit_error = 0, None

    def _fit_failed(self, end_s: float, failure: FitFailed) -> None:
        """Keep the last good fit (or the stand-in) and try again after a backoff that
        doubles from one step up to the refit interval."""
        self.fit_failures += 1
        self._failed_in_a_row += 1
        self.last_fit_error = failure.describe()
        backoff_s = min(self.step_s * 2 ** (self._failed_in_a_row - 1), self.refit_s)
        self._retry_at = end_s + backoff_s
        if self._stand_in_reason is not None:  # no good fit yet: the stand-in says why
            self._stand_in_reason = f"last value: the fit failed ({self.last_fit_error})"

    def _close_step(self, count: float, end_s: float) -> None:
        self._score(count, end_s)
        if self._calibrator is not None:
            self._calibrator.observe(self.origin_s + end_s - self.step_s, count)
        self._history.append(count)
        self._closed_steps += 1
        if self._fitted is not None and self._stand_in_reason is None:
            self._fitted.update(np.array([count]))
        due = end_s - self._fitted_at >= self.refit_s or self._stand_in_reason is not None
        if due and end_s >= self._retry_at:
            self._try_fit(end_s)
        if self._fitted is not None:
            self.forecast = self._predict()

    def _score(self, count: float, end_s: float) -> None:
        if self.forecast is None:
            return
        # The error of the forecast in force, a stand-in's too (what the dashboard shows
        # from the first minute); only the model on trial is scored against its band.
        self.last_error_rps = (count - float(self.forecast.mean[0])) / self.step_s
        if self._scored_stand_in:
            return
        self.steps_scored += 1
        # Counts are Poisson around the rate: allow three standard deviations of that noise.
        lower, upper = float(self.forecast.lower[0]), float(self.forecast.upper[0])
        inside = lower - 3 * math.sqrt(lower) <= count <= upper + 3 * math.sqrt(upper)
        if inside:
            self._outside_since = None
            return
        self.steps_outside += 1
        if self._outside_since is None:
            self._outside_since = end_s - self.step_s

    def _start_from_first_tick(self, now: float, arrivals: int) -> None:
        """Before the first step closes, the first tick's rate stands in for a step, so
        a controller has a (last-value) forecast from its first tick."""
        elapsed_s = max(now - (self._step_end - self.step_s), 1e-9)
        first = RateSeries(
            self.origin_s - self.step_s, self.step_s, np.array([arrivals * self.step_s / elapsed_s])
        )
        self._fitted = self._stand_in.fit(first)
        self._stand_in_reason = "last value: the first tick's rate"

    def _series(self, end_s: float) -> RateSeries:
        """The closed steps' history, the last of which ends at `end_s`."""
        return RateSeries(
            self.origin_s + end_s - self.step_s * len(self._history),
            self.step_s,
            np.array(self._history, dtype=np.float64),
        )

    def _try_fit(self, end_s: float) -> None:
        """Fit on the history of closed steps, the last of which ends at `end_s`."""
        series = self._series(end_s)
        if not self._model_needs_no_history and len(self._history) < self.min_history_steps:
            reason = f"{len(self._history)} of {self.min_history_steps} steps of history"
            self._use_stand_in(series, InvalidInput(reason))
            return
        job = FitJob(self._model, series, end_s, self._closed_steps)
        if self.defer_fits:
            if self._taken is None:
                self._job = job
            return
        outcome = job.run()
        if isinstance(outcome, FitFailed):
            self._fit_failed(end_s, outcome)
        elif isinstance(outcome, InvalidInput):
            self._use_stand_in(series, outcome)
        else:
            self._fitted_with(outcome, end_s)

    def _use_stand_in(self, series: RateSeries, why: InvalidInput) -> None:
        if not self._history:
            return
        self._fitted = self._stand_in.fit(series)
        self._stand_in_reason = f"last value: {why}"

    def _predict(self) -> Forecast:
        forecast = self._fitted.predict(self.horizon_steps, self.level)
        self._scored_stand_in = self._stand_in_reason is not None
        if self._stand_in_reason is not None:
            return replace(forecast, fallback=self._stand_in_reason)
        if self._calibrator is None:
            return forecast
        self._calibrator.record(forecast)  # raw: scores measure the model's own errors
        return self._calibrator.calibrate(forecast)
