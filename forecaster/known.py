"""A forecaster that knows the future: the simulator's oracle.

Given the recorded series itself, it "predicts" exactly what will arrive, with no band.
Policies that plan with it are the upper bound that forecasting policies are measured
against. It exists only where the future is on file, which is to say in simulation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

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
        clock = StepClock(end, series.step_s, end)
        return FittedKnownFuture(self.name, self.truth, clock, self.cumulative)

    @cached_property
    def cumulative(self) -> np.ndarray:
        """The truth's running count from its start, once per oracle rather than once per
        prediction (summing a long trace on every tick made a day's oracle quadratic)."""
        return np.concatenate(([0.0], np.cumsum(self.truth.counts)))


@dataclass
class FittedKnownFuture:
    name: str
    truth: RateSeries
    clock: StepClock
    cumulative: np.ndarray = field(repr=False)

    def update(self, values: np.ndarray) -> None:
        self.clock.advance(len(values))

    def predict(self, steps: int, level: float = 0.9) -> Forecast:
        times = self.clock.ahead(steps)
        # Truth at the feed's step: sum the truth's own steps that fall in each one.
        edges = np.append(times, times[-1] + self.clock.step_s) if steps else times
        cumulative = self.cumulative
        positions = np.clip((edges - self.truth.start_s) / self.truth.step_s, 0, len(self.truth))
        # On an integer grid, interpolation is the floor's value plus the fraction's share.
        whole = np.minimum(positions.astype(np.int64), cumulative.size - 2)
        at = cumulative[whole] + (positions - whole) * (cumulative[whole + 1] - cumulative[whole])
        mean = np.diff(at)
        return self.clock.forecast(mean, np.zeros_like(mean), level, self.name, None)
