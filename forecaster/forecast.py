"""A forecast: a mean path with a band, and what produced it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Forecast:
    """Requests per step ahead, with a central band at `level` (0.9: 5%..95%).

    times_s[i] is the start of the i-th step ahead. `fallback` says, in words, when a
    simpler model stands in for the one asked for, and why; `band` whether the band is
    the model's own (analytic) or calibrated on its recent errors (`forecaster.conformal`).
    """

    times_s: np.ndarray
    step_s: float
    mean: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    level: float
    model: str
    fitted_at_s: float
    fallback: str | None = None
    events: tuple[str, ...] = ()
    band: str = "analytic"

    # Rates per second, computed once per forecast (a policy reads them every tick) and
    # read-only, since every reader shares them.
    @cached_property
    def mean_rps(self) -> np.ndarray:
        return _frozen(self.mean / self.step_s)

    @cached_property
    def upper_rps(self) -> np.ndarray:
        return _frozen(self.upper / self.step_s)

    @cached_property
    def lower_rps(self) -> np.ndarray:
        return _frozen(self.lower / self.step_s)

    def clipped(self) -> Forecast:
        """Rates cannot be negative."""
        return replace(
            self,
            mean=np.maximum(self.mean, 0.0),
            lower=np.maximum(self.lower, 0.0),
            upper=np.maximum(self.upper, 0.0),
        )


def _frozen(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False
    return values
