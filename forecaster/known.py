"""A forecaster that knows the future: the simulator's oracle.

Given the recorded series itself, it "predicts" exactly what will arrive, with no band.
Policies that plan with it are the upper bound that forecasting policies are measured
against. It exists only where the future is on file, which is to say in simulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from forecaster.forecast import Forecast
from forecaster.models import StepClock
from forecaster.series import RateSeries


@dataclass(frozen=True)
class KnownFuture:
    """Fits to any history (even none) and predicts the recorded `truth`."""

    truth: RateSeries
    name: str = "oracle"

    def fit(self, series: RateSeries) -> FittedKnownFuture:
        end = series.start_s + len(series) * series.step_s
        return FittedKnownFuture(self.name, self.truth, StepClock(end, series.step_s, end))


@dataclass
class FittedKnownFuture:
    name: str
    truth: RateSeries
    clock: StepClock

    def update(self, values: np.ndarray) -> None:
        self.clock.advance(len(values))

    def predict(self, steps: int, level: float = 0.9) -> Forecast:
        times = self.clock.ahead(steps)
        # Truth at the feed's step: sum the truth's own steps that fall in each one.
        edges = np.append(times, times[-1] + self.clock.step_s) if steps else times
        cumulative = np.concatenate(([0.0], np.cumsum(self.truth.counts)))
        positions = np.clip((edges - self.truth.start_s) / self.truth.step_s, 0, len(self.truth))
        at = np.interp(positions, np.arange(cumulative.size), cumulative)
        mean = np.diff(at)
        return self.clock.forecast(mean, np.zeros_like(mean), level, self.name, None)
