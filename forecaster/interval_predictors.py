"""One-step load predictors, as NVIDIA Dynamo's planner runs them: the next interval's
request count from the counts of the last ones.

Dynamo's SLA planner (`components/planner`, `SLAPlannerDefaults`) predicts the next
`adjustment_interval`'s load with one of `constant` (the last interval again), `arima`
(its default: auto-ARIMA over the last `load_prediction_window_size` = 50 intervals) or
`kalman` (a local linear trend filter: `kalman_q_level` 1.0, `kalman_q_trend` 0.1,
`kalman_r` 10.0, predicting only after `kalman_min_points` = 5 points); `prophet` is
left out here (Prophet is not a dependency of this project). The simulator's Dynamo-style
baseline (`adaptive.dynamo_planner`) sizes replicas from these predictions.

Differences from Dynamo, kept small and named: the ARIMA order is fixed at (1, 1, 1)
rather than searched per fit (pmdarima's auto-ARIMA is not a dependency, and one fit
every interval of a simulated day must stay cheap); a fit that fails or does not
converge predicts the last count, as Dynamo's does before it has enough data.
"""

from __future__ import annotations

import math
import warnings
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from tidal_base.errors import InvalidInput

WINDOW = 50
"""Intervals a predictor keeps (Dynamo's `load_prediction_window_size`)."""


class IntervalPredictor(Protocol):
    """Predicts the next interval's count from those observed so far.

    `observe` is called once per interval, in time order, with that interval's count
    (>= 0); `predict` returns the next one's (>= 0), the last count observed while the
    predictor has too little history, 0 before any."""

    name: str

    def observe(self, count: float) -> None: ...

    def predict(self) -> float: ...


@dataclass
class ConstantPredictor:
    """The next interval repeats the last one."""

    name: str = "constant"
    _last: float = field(default=0.0, init=False)

    def observe(self, count: float) -> None:
        self._last = count

    def predict(self) -> float:
        return self._last


@dataclass
class ArimaPredictor:
    """ARIMA(1, 1, 1) fitted to the last `window` counts at every prediction."""

    window: int = WINDOW
    min_points: int = 5
    name: str = "arima"
    _counts: deque[float] = field(default_factory=deque, init=False)

    def __post_init__(self) -> None:
        if self.window < 3 or self.min_points < 3:
            raise InvalidInput("an ARIMA predictor needs a window and min_points of >= 3")
        self._counts = deque(maxlen=self.window)

    def observe(self, count: float) -> None:
        self._counts.append(count)

    def predict(self) -> float:
        if len(self._counts) < self.min_points:
            return self._counts[-1] if self._counts else 0.0
        values = np.asarray(self._counts, dtype=np.float64)
        if np.ptp(values) == 0:  # a flat window: nothing to fit, and statsmodels warns
            return float(values[-1])
        from statsmodels.tsa.arima.model import ARIMA  # ~1 s to import: only when used

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence and frequency warnings, per fit
            try:
                fitted = ARIMA(values, order=(1, 1, 1)).fit()
                predicted = float(fitted.forecast(1)[0])
            except (ValueError, np.linalg.LinAlgError):
                return float(values[-1])
        return max(0.0, predicted) if math.isfinite(predicted) else float(values[-1])


@dataclass
class KalmanPredictor:
    """A local linear trend Kalman filter (level and trend), predicting one step ahead
    once `min_points` counts are in; the last count before that."""

    q_level: float = 1.0
    q_trend: float = 0.1
    r: float = 10.0
    min_points: int = 5
    name: str = "kalman"
    _state: np.ndarray | None = field(default=None, init=False)
    _covariance: np.ndarray = field(default_factory=lambda: np.eye(2) * 1e6, init=False)
    _seen: int = field(default=0, init=False)
    _last: float = field(default=0.0, init=False)

    _STEP = np.array([[1.0, 1.0], [0.0, 1.0]])  # level += trend

    def __post_init__(self) -> None:
        if min(self.q_level, self.q_trend, self.r) <= 0 or self.min_points < 1:
            raise InvalidInput("kalman noises must be > 0 and min_points >= 1")
        self._noise = np.diag([self.q_level, self.q_trend])

    def observe(self, count: float) -> None:
        self._seen += 1
        self._last = count
        if self._state is None:
            self._state = np.array([count, 0.0])
            return
        state = self._STEP @ self._state
        covariance = self._STEP @ self._covariance @ self._STEP.T + self._noise
        innovation = count - state[0]
        gain = covariance[:, 0] / (covariance[0, 0] + self.r)
        self._state = state + gain * innovation
        self._covariance = covariance - np.outer(gain, covariance[0, :])

    def predict(self) -> float:
        if self._state is None or self._seen < self.min_points:
            return self._last
        return max(0.0, float(self._state[0] + self._state[1]))


PREDICTORS = ("constant", "arima", "kalman")
"""The predictor names a Dynamo-style planner spec may give."""


def build_interval_predictor(name: str) -> IntervalPredictor:
    """A predictor by its Dynamo name, with Dynamo's default settings."""
    if name == "constant":
        return ConstantPredictor()
    if name == "arima":
        return ArimaPredictor()
    if name == "kalman":
        return KalmanPredictor()
    raise InvalidInput(f"unknown load predictor {name!r} (known: {', '.join(PREDICTORS)})")
