"""A measured latency table made physical: monotone in batch size.

A profile is a handful of timed runs per size, and on a busy machine one point can be
noise (seen live: batch 2 at 11 ms under batch 1 at 25 ms, batch 8 at 344 ms over batch
16 at 100 ms). The planner reads the table literally, so one such point makes it believe
that a larger batch is faster, or that no batch meets the SLO. Two facts of batching
hold for any model, and the fit imposes both:

- a batch of more items never takes less time (time per batch is non-decreasing);
- a batch of more items never takes more time per item (time per item is
  non-increasing): batching amortises, it does not cost throughput.

Each is a weighted isotonic regression (pool-adjacent-violators), the least-squares
closest curve that obeys it; the two are alternated until both hold, which converges since
both sets are convex and a constant per-item time lies in both. A table that already obeys
both comes back unchanged. The regression is the dozen lines below rather than scipy's
`isotonic_regression`: importing `scipy.optimize` takes 1-2 s (it loads linprog and
more), which every command that loads a profile would pay for a table of eight points.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_ROUNDS = 50
_TOLERANCE = 1e-12


def monotone_times(
    batch_sizes: Sequence[int], times_s: Sequence[float], weights: Sequence[float] | None = None
) -> tuple[float, ...]:
    """`times_s` (seconds per batch at each of the increasing `batch_sizes`) fitted so that
    time per batch never falls and time per item never rises with the batch size.

    `weights` say how much each point is trusted (runs or batches measured); equal if None.
    """
    sizes = np.asarray(batch_sizes, dtype=np.float64)
    times = np.asarray(times_s, dtype=np.float64)
    w = np.ones_like(times) if weights is None else np.maximum(np.asarray(weights, float), 1e-9)
    for _ in range(_ROUNDS):
        if _physical(sizes, times):
            break
        times = isotonic(times, w, increasing=True)
        # Per item, weighted so the fit stays least-squares in seconds per batch.
        per_item = isotonic(times / sizes, w * sizes**2, increasing=False)
        times = per_item * sizes
    # What is left after the rounds is rounding: close it from below, never faster.
    times = np.maximum.accumulate(times)
    return tuple(float(t) for t in times)


def isotonic(values: np.ndarray, weights: np.ndarray, increasing: bool = True) -> np.ndarray:
    """The weighted least-squares fit to `values` that never falls (or, with
    `increasing=False`, never rises): pool adjacent violators into their weighted mean."""
    sign = 1.0 if increasing else -1.0
    blocks: list[list[float]] = []  # [weighted mean, weight, count], means non-decreasing
    for value, weight in zip(sign * np.asarray(values, float), weights, strict=True):
        blocks.append([value, float(weight), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, total, count = blocks.pop()
            merged = blocks[-1]
            merged_weight = merged[1] + total
            merged[0] = (merged[0] * merged[1] + mean * total) / merged_weight
            merged[1], merged[2] = merged_weight, merged[2] + count
    return sign * np.repeat([b[0] for b in blocks], [b[2] for b in blocks])


def _physical(sizes: np.ndarray, times: np.ndarray) -> bool:
    per_item = times / sizes
    return bool(np.all(np.diff(times) >= -_TOLERANCE) and np.all(np.diff(per_item) <= _TOLERANCE))


def monotone_table(
    batch_sizes: Sequence[int],
    means_s: Sequence[float],
    p99s_s: Sequence[float] | None,
    weights: Sequence[float] | None = None,
) -> tuple[tuple[float, ...], tuple[float, ...] | None]:
    """A table's mean and p99 columns, each fitted by `monotone_times`, with every p99 kept
    at or above its mean."""
    means = monotone_times(batch_sizes, means_s, weights)
    if p99s_s is None:
        return means, None
    p99s = monotone_times(batch_sizes, p99s_s, weights)
    return means, tuple(max(p, m) for p, m in zip(p99s, means, strict=True))
