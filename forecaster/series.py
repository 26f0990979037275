"""Fixed-step request-rate series, and the helpers that build them from traces.

A `RateSeries` holds requests per step (not per second) at a fixed step, starting at
`start_s` (Unix seconds when the source has wall-clock time, else seconds from its
start). Gaps are NaN. The same helpers serve `simulate` traces, backtests and, later,
per-window counts reported by workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from tidal_base.errors import InvalidInput


@dataclass(frozen=True)
class RateSeries:
    """Requests per step; counts[i] covers [start_s + i*step_s, start_s + (i+1)*step_s)."""

    start_s: float
    step_s: float
    counts: np.ndarray

    def __post_init__(self) -> None:
        if not self.step_s > 0:
            raise InvalidInput(f"step must be > 0, got {self.step_s}")

    def __len__(self) -> int:
        return int(self.counts.size)

    @property
    def rates_rps(self) -> np.ndarray:
        return self.counts / self.step_s

    def times_s(self) -> np.ndarray:
        return self.start_s + self.step_s * np.arange(self.counts.size)

    def slice(self, start: int, stop: int) -> RateSeries:
        return RateSeries(self.start_s + start * self.step_s, self.step_s, self.counts[start:stop])

    def steps_per(self, period_s: float) -> int:
        """How many steps make up a period (a day, a week), rounded."""
        return max(1, round(period_s / self.step_s))


def epoch_seconds(moment: datetime | None) -> float:
    """Unix seconds of a naive-UTC or aware datetime; 0 when there is none."""
    if moment is None:
        return 0.0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def resample_counts(
    counts: np.ndarray, step_s: float, new_step_s: float, start_s: float = 0.0
) -> RateSeries:
    """Per-interval counts at any other step. Each interval's count is spread evenly over
    its interval (the cumulative count is linear within it), so a 5-minute export
    replays at a 1 s step as 300 equal seconds, and a coarser step sums whole intervals
    exactly. Only whole steps are kept: a partial last one would read as a drop."""
    if not new_step_s > 0:
        raise InvalidInput(f"step must be > 0, got {new_step_s}")
    duration_s = counts.size * step_s
    steps = math.floor(duration_s / new_step_s + 1e-9)
    if steps < 1:
        raise InvalidInput(
            f"step {new_step_s:g}s is longer than the trace's {duration_s:g}s of intervals"
        )
    edges_s = np.arange(counts.size + 1) * step_s
    cumulative = np.concatenate(([0.0], np.cumsum(counts, dtype=np.float64)))
    at = np.interp(np.arange(steps + 1) * new_step_s, edges_s, cumulative)
    return RateSeries(start_s, new_step_s, np.diff(at))


def resample_arrivals(
    arrivals_s: np.ndarray, step_s: float, start_s: float = 0.0, duration_s: float | None = None
) -> RateSeries:
    """Count request timestamps (seconds from start_s) per step."""
    duration_s = duration_s if duration_s is not None else float(arrivals_s.max(initial=0.0))
    steps = max(1, math.ceil(duration_s / step_s - 1e-9))
    index = np.minimum((arrivals_s // step_s).astype(np.int64), steps - 1)
    return RateSeries(start_s, step_s, np.bincount(index, minlength=steps).astype(np.float64))


def series_from_trace(trace, step_s: float) -> RateSeries:
    """A rate series from a loaded `simulations.traces` trace, at `step_s`."""
    start_s = epoch_seconds(trace.origin)
    if hasattr(trace, "counts"):
        return resample_counts(trace.counts, trace.step_s, step_s, start_s)
    return resample_arrivals(trace.arrivals_s, step_s, start_s, trace.duration_s)


def fill_gaps(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Linearly interpolate NaNs (edges take the nearest value); returns the fill count."""
    missing = np.isnan(values)
    count = int(missing.sum())
    if count == 0:
        return values, 0
    if count == values.size:
        return np.zeros_like(values), count
    positions = np.arange(values.size)
    filled = values.copy()
    filled[missing] = np.interp(positions[missing], positions[~missing], values[~missing])
    return filled, count
