"""A latency model learned from serving: what each padded batch size takes on the
hardware as it serves now, blended with the profile the pool was planned with.

Workers report per window the execution times of the batches they ran, by padded size
(`ExecutionTimes`: sparse `adaptive.histogram` counts, so reports merge exactly). The
`LatencyLearner` keeps, per size, a histogram decayed with a half-life on the
controller's clock, and answers a `TableLatency`:

- at a size with data, its decayed mean and p99 blended with the prior's, with weight
  `n / (n + prior_batches)` on what was measured (n: the decayed batch count);
- at a size without, the prior scaled by the slowdown the measured sizes show (their
  count-weighted geometric mean of measured/prior, shrunk toward 1 by the same prior
  weight): a machine that runs every batch 1.4x slower than profiled, because the cores
  are shared, is planned so at sizes it has not served yet.

No data means the prior itself. The simulator's pool reports no execution times (its
times are the prior by construction), so a simulated and a live controller plan alike
until live serving says otherwise. `drift` compares the learned model with the one the
planner's table was compiled from, at sizes with enough data; the controller rebuilds
the table when it passes `LearningSettings.drift_threshold`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from adaptive.histogram import (
    BUCKET_REPRESENTATIVES_S,
    MIN_VALUE_S,
    NUM_BUCKETS,
    LatencyHistogram,
    add_buckets,
)
from adaptive.latency import LatencyModel, TableLatency, p99_s
from adaptive.latency_fit import monotone_table
from tidal_base.errors import InvalidInput

PLANNED_SIZES = tuple(2**k for k in range(9))
"""Sizes a learned table always holds (the planner's power-of-two caps, 1 to 256)."""


@dataclass(frozen=True, slots=True)
class ExecutionTimes:
    """The batches of one padded size a reporter ran in one window, and how long each took
    on the device: `buckets` are sparse `adaptive.histogram` counts, `total_s` their sum."""

    padded_size: int
    batches: int
    total_s: float
    buckets: tuple[tuple[int, int], ...]

    @classmethod
    def from_samples(cls, padded_size: int, samples_s: Iterable[float]) -> ExecutionTimes:
        """The report of batches of `padded_size` that took `samples_s` seconds each."""
        histogram = LatencyHistogram.from_samples(np.asarray(list(samples_s), dtype=np.float64))
        nonzero = np.flatnonzero(histogram.counts)
        buckets = tuple((int(b), int(histogram.counts[b])) for b in nonzero)
        return cls(padded_size, histogram.count, histogram.sum_s, buckets)


@dataclass(frozen=True, slots=True)
class LearningSettings:
    """How fast the learned model forgets, how much it trusts the prior, when it replans.

    half_life_s: a batch measured this long ago counts half.
    prior_batches: the prior weighs as much as this many measured batches at a size.
    min_batches: a size counts toward drift once it has this many (decayed) batches.
    drift_threshold: the relative change in mean or p99 at such a size that rebuilds the
        planner's table.
    min_interval_s: at least this long between two rebuilds (a table costs CPU seconds).
    """

    half_life_s: float = 300.0
    prior_batches: float = 20.0
    min_batches: float = 30.0
    drift_threshold: float = 0.2
    min_interval_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("half_life_s", "prior_batches", "min_batches", "drift_threshold"):
            value = getattr(self, name)
            # An infinite drift threshold learns and shows, and never rebuilds.
            if not value > 0 or (math.isinf(value) and name != "drift_threshold"):
                raise InvalidInput(f"latency learning: {name} must be > 0, got {value}")
        if not (math.isfinite(self.min_interval_s) and self.min_interval_s >= 0):
            raise InvalidInput(
                f"latency learning: min_interval_s must be >= 0, got {self.min_interval_s}"
            )


@dataclass(frozen=True, slots=True)
class SizeEstimate:
    """The model's service time at one batch size and where it came from."""

    batch_size: int
    mean_s: float
    p99_s: float
    batches: float  # decayed count measured at this size
    source: str  # "prior", "measured", "blended" or "prior x1.31" (scaled by the slowdown)

    def to_dict(self) -> dict[str, Any]:
        """As the API shows it, in milliseconds."""
        return {
            "batch_size": self.batch_size,
            "mean_ms": round(self.mean_s * 1e3, 4),
            "p99_ms": round(self.p99_s * 1e3, 4),
            "batches": round(self.batches, 1),
            "source": self.source,
        }


@dataclass(frozen=True, slots=True)
class Drift:
    """How far the learned model moved from the planner's, and at which size."""

    relative: float
    batch_size: int | None
    measure: str  # "mean" or "p99"

    def describe(self) -> str:
        """One line for logs and decision records: where and how far it moved."""
        if self.batch_size is None:
            return "no size has enough batches to compare"
        return f"batch {self.batch_size} {self.measure} {self.relative:+.0%} from the planner's"


class _SizeState:
    """One padded size's decayed histogram, batch count and sum."""

    __slots__ = ("batches", "counts", "total_s")

    def __init__(self) -> None:
        self.counts = np.zeros(NUM_BUCKETS, dtype=np.float64)
        self.batches = 0.0
        self.total_s = 0.0

    def copy(self) -> _SizeState:
        twin = _SizeState()
        twin.counts, twin.batches, twin.total_s = self.counts.copy(), self.batches, self.total_s
        return twin

    def add(self, times: ExecutionTimes) -> None:
        add_buckets(self.counts, times.buckets)
        self.batches += times.batches
        self.total_s += times.total_s

    def decay(self, factor: float) -> None:
        self.counts *= factor
        self.batches *= factor
        self.total_s *= factor

    def mean_s(self) -> float:
        """The decayed mean, never below the histogram's resolution: a batch timed at
        zero ran under the clock's resolution, not for free (a ratio to it is defined)."""
        return max(self.total_s / self.batches, MIN_VALUE_S)

    def p99_s(self) -> float:
        cumulative = self.counts.cumsum()
        index = int(cumulative.searchsorted(0.99 * cumulative[-1]))
        return float(BUCKET_REPRESENTATIVES_S[min(index, NUM_BUCKETS - 1)])


class LatencyLearner:
    """Per padded size, a decayed distribution of measured execution times over a prior.

    prior: the model the pool was planned with (what a size with no data takes);
    settings: half-life, prior weight and when to replan (defaults: `LearningSettings`).
    """

    def __init__(self, prior: LatencyModel, settings: LearningSettings | None = None) -> None:
        self.prior = prior
        self.settings = settings or LearningSettings()
        self._sizes: dict[int, _SizeState] = {}
        self._at: float | None = None
        self._model: LatencyModel | None = None  # cached until the next observation

    def copy(self) -> LatencyLearner:
        """An independent learner that knows what this one knows (a controller that
        replaces another starts from what serving taught it, on the same clock)."""
        twin = LatencyLearner(self.prior, self.settings)
        for size, state in self._sizes.items():
            twin._sizes[size] = state.copy()
        twin._at = self._at
        return twin

    @property
    def measured_batches(self) -> float:
        """The decayed count of batches measured, over every size."""
        return sum(state.batches for state in self._sizes.values())

    def observe(self, now: float, times: Iterable[ExecutionTimes]) -> None:
        """Age what is known to `now`, then add one tick's reports."""
        times = [t for t in times if t.batches > 0]
        if self._at is not None and now > self._at and self._sizes:
            factor = 0.5 ** ((now - self._at) / self.settings.half_life_s)
            for state in self._sizes.values():
                state.decay(factor)
            self._model = None
        self._at = now if self._at is None else max(self._at, now)
        for t in times:
            if t.padded_size < 1:
                continue
            self._sizes.setdefault(t.padded_size, _SizeState()).add(t)
            self._model = None

    def estimates(self) -> tuple[SizeEstimate, ...]:
        """The model at every size it holds: the prior's, the planner's and those served."""
        sizes = sorted({*_prior_sizes(self.prior), *PLANNED_SIZES, *self._sizes})
        if not self._sizes:
            return tuple(self._prior_estimate(b, 1.0, 1.0) for b in sizes)
        mean_scale, p99_scale = self._slowdown()
        return tuple(
            self._blended(b, self._sizes[b])
            if b in self._sizes and self._sizes[b].batches > 0
            else self._prior_estimate(b, mean_scale, p99_scale)
            for b in sizes
        )

    def model(self) -> LatencyModel:
        """The learned model as a `TableLatency` (the prior itself while nothing is known)."""
        if not self._sizes:
            return self.prior
        if self._model is None:
            self._model = self._table(self.estimates())
        return self._model

    def drift(self, against: LatencyModel) -> Drift:
        """The largest relative change in mean or p99, at a size with at least
        `min_batches` measured, from `against` (the model the planner's table used)."""
        worst = Drift(0.0, None, "mean")
        model = self.model()
        for size, state in sorted(self._sizes.items()):
            if state.batches < self.settings.min_batches:
                continue
            at = np.array([size], dtype=np.float64)
            for measure, ours, theirs in (
                ("mean", _mean(model, at), _mean(against, at)),
                ("p99", _p99(model, at), _p99(against, at)),
            ):
                change = math.expm1(_log_ratio(ours, theirs))
                if worst.batch_size is None or abs(change) > abs(worst.relative):
                    worst = Drift(change, size, measure)
        return worst

    # -- the blend ------------------------------------------------------------------

    def _weight(self, batches: float) -> float:
        return batches / (batches + self.settings.prior_batches)

    def _blended(self, size: int, state: _SizeState) -> SizeEstimate:
        at = np.array([size], dtype=np.float64)
        prior_mean, prior_p99 = _mean(self.prior, at), _p99(self.prior, at)
        w = self._weight(state.batches)
        measured_mean = state.mean_s()
        measured_p99 = max(state.p99_s(), measured_mean)
        mean = w * measured_mean + (1 - w) * prior_mean
        p99 = max(w * measured_p99 + (1 - w) * prior_p99, mean)
        source = "measured" if w >= 0.95 else "blended"
        return SizeEstimate(size, mean, p99, state.batches, source)

    def _slowdown(self) -> tuple[float, float]:
        """Measured/prior for mean and p99 over the sizes served: the count-weighted mean
        of log ratios, shrunk toward 1 as a single size's blend would be."""
        log_mean = log_p99 = weight = 0.0
        for size, state in self._sizes.items():
            if state.batches <= 0:
                continue
            at = np.array([size], dtype=np.float64)
            measured_mean = state.mean_s()
            log_mean += state.batches * _log_ratio(measured_mean, _mean(self.prior, at))
            measured_p99 = max(state.p99_s(), measured_mean)
            log_p99 += state.batches * _log_ratio(measured_p99, _p99(self.prior, at))
            weight += state.batches
        shrunk = weight + self.settings.prior_batches
        return math.exp(log_mean / shrunk), math.exp(log_p99 / shrunk)

    def _prior_estimate(self, size: int, mean_scale: float, p99_scale: float) -> SizeEstimate:
        at = np.array([size], dtype=np.float64)
        mean = _mean(self.prior, at) * mean_scale
        p99 = max(_p99(self.prior, at) * p99_scale, mean)
        source = "prior" if mean_scale == 1.0 else f"prior x{mean_scale:.2f}"
        return SizeEstimate(size, mean, p99, 0.0, source)

    def _table(self, estimates: tuple[SizeEstimate, ...]) -> TableLatency:
        # Monotone in batch size, as a loaded profile is: a size measured over few batches
        # must not make the planner believe a larger batch is faster. Each size weighs its
        # decayed batch count, and a size only the prior speaks for weighs one batch, so
        # where the two disagree, what was measured moves least.
        sizes = [e.batch_size for e in estimates]
        weights = [e.batches + 1.0 for e in estimates]
        means, p99s = monotone_table(
            sizes, [e.mean_s for e in estimates], [e.p99_s for e in estimates], weights
        )
        assert p99s is not None
        values = tuple(
            (b, round(m, 9), round(p, 9)) for b, m, p in zip(sizes, means, p99s, strict=True)
        )
        # The planner's tables are cached by description: it names the values it holds.
        digest = hashlib.sha1(repr(values).encode()).hexdigest()[:10]
        source = (
            f"learned from {self.measured_batches:.0f} batches on {self.prior.describe()} "
            f"[{digest}]"
        )
        return TableLatency(
            tuple(b for b, _, _ in values),
            tuple(m for _, m, _ in values),
            tuple(p for _, _, p in values),
            self.prior.memory,
            source,
            self.prior.overhead,
        )


def _log_ratio(measured_s: float, prior_s: float) -> float:
    """log(measured/prior), both floored at the histogram's resolution (a zero from a
    coarse clock, or a prior that calls a size free, must not make it undefined)."""
    return math.log(max(measured_s, MIN_VALUE_S) / max(prior_s, MIN_VALUE_S))


def _prior_sizes(prior: LatencyModel) -> tuple[int, ...]:
    return prior.batch_sizes if isinstance(prior, TableLatency) else ()


def _mean(model: LatencyModel, at: np.ndarray) -> float:
    return float(model.mean_s(at)[0])


def _p99(model: LatencyModel, at: np.ndarray) -> float:
    return float(p99_s(model, at)[0])
