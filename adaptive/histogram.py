"""A mergeable, log-bucketed latency histogram with bounded relative error.

Simulated days hold hundreds of millions of latencies and live workers report theirs
every second; neither can keep raw samples. Buckets grow geometrically by `GAMMA`, so
any quantile read from a bucket's representative value is within
(GAMMA - 1) / (GAMMA + 1) < 1% of the true sample at that rank (the DDSketch bound).
Histograms with the same layout merge by adding counts, which is how per-tick,
per-window, per-worker and per-run figures are combined.

The bucket layout is module-level so that compiled kernels can fill the same arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

GAMMA = 1.02
"""Ratio between consecutive bucket bounds."""
MIN_VALUE_S = 1e-6
"""Values below this (1 us) share bucket 0."""
MAX_VALUE_S = 1e5
"""Values at or above this share the last bucket."""
NUM_BUCKETS = 2 + math.ceil(math.log(MAX_VALUE_S / MIN_VALUE_S) / math.log(GAMMA))
INV_LOG_GAMMA = 1.0 / math.log(GAMMA)
RELATIVE_ERROR = (GAMMA - 1) / (GAMMA + 1)


BUCKET_LOWER_S = np.concatenate(
    ([-np.inf], MIN_VALUE_S * GAMMA ** np.arange(NUM_BUCKETS - 1, dtype=np.float64))
)
"""Inclusive lower bound of each bucket: bucket b holds [BUCKET_LOWER_S[b], BUCKET_LOWER_S[b+1])."""

BUCKET_REPRESENTATIVES_S = np.concatenate(
    ([MIN_VALUE_S / 2], 2.0 * BUCKET_LOWER_S[1:] * GAMMA / (1.0 + GAMMA))
)
"""The value each bucket reports for the quantiles that land in it."""


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Latency figures of one histogram, in seconds; None where there are no samples."""

    count: int
    mean_s: float | None
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    p999_s: float | None
    max_s: float | None


class LatencyHistogram:
    """Counts of latencies in geometric buckets, plus the exact count, sum and max."""

    __slots__ = ("counts", "max_s", "sum_s")

    def __init__(self) -> None:
        self.counts = np.zeros(NUM_BUCKETS, dtype=np.int64)
        self.sum_s = 0.0
        self.max_s = 0.0

    @classmethod
    def from_samples(cls, samples_s: np.ndarray) -> LatencyHistogram:
        """A histogram of `samples_s` (seconds, any array-like)."""
        hist = cls()
        hist.record_many(np.asarray(samples_s, dtype=np.float64))
        return hist

    @property
    def count(self) -> int:
        """Samples recorded."""
        return int(self.counts.sum())

    def record_many(self, samples_s: np.ndarray) -> None:
        """Record an array of latencies in seconds (values below `MIN_VALUE_S` land in bucket 0, at
        or above `MAX_VALUE_S` in the last); an empty array changes nothing."""
        if samples_s.size == 0:
            return
        index = np.searchsorted(BUCKET_LOWER_S, samples_s, side="right") - 1
        self.counts += np.bincount(index, minlength=NUM_BUCKETS)
        self.sum_s += float(samples_s.sum())
        self.max_s = max(self.max_s, float(samples_s.max()))

    def add_counts(self, counts: np.ndarray, sum_s: float, max_s: float) -> None:
        """Fold in raw bucket counts filled elsewhere (a kernel, a worker's report)."""
        self.counts += counts
        self.sum_s += sum_s
        self.max_s = max(self.max_s, max_s)

    def merge(self, other: LatencyHistogram) -> None:
        """Fold `other` in (same layout, so exact): counts and sums add, the max is the larger.
        `other` is unchanged."""
        self.add_counts(other.counts, other.sum_s, other.max_s)

    def quantile_s(self, q: float) -> float | None:
        """Nearest-rank quantile (the sample at rank ceil(q * n)), within RELATIVE_ERROR."""
        return quantile_from_counts(self.counts, q, self.max_s)

    def summary(self) -> LatencySummary:
        """Count, mean, p50, p90, p99, p99.9 and max, in seconds; all but the count None when
        nothing was recorded."""
        n = self.count
        quantile = self.quantile_s
        return LatencySummary(
            count=n,
            mean_s=self.sum_s / n if n else None,
            p50_s=quantile(0.5),
            p90_s=quantile(0.9),
            p99_s=quantile(0.99),
            p999_s=quantile(0.999),
            max_s=self.max_s if n else None,
        )


def add_buckets(counts: np.ndarray, buckets) -> np.ndarray:
    """Add sparse `(bucket, count)` pairs (as workers report them) into dense `counts`."""
    for bucket, count in buckets:
        counts[bucket] += count
    return counts


def quantile_from_counts(counts: np.ndarray, q: float, max_s: float | None = None) -> float | None:
    """Nearest-rank quantile of bucket counts; capped at the exact max when it is known."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    cumulative = np.cumsum(counts)
    total = int(cumulative[-1]) if cumulative.size else 0
    if total == 0:
        return None
    rank = max(1, math.ceil(q * total))
    value = float(BUCKET_REPRESENTATIVES_S[int(np.searchsorted(cumulative, rank))])
    return min(value, max_s) if max_s else value
