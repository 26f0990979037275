"""Warmed batch-size buckets: why a worker cannot raise its batch cap instantly.

Fast paths are prepared per batch size (CUDA Graph capture, TensorRT profiles, compiled
shapes). A worker keeps a set of warmed buckets, powers of two, and runs a batch padded
to the smallest warmed bucket that holds it. Serving a cap needs every bucket up to
`bucket_for(cap)`. Raising the cap past the warmed buckets warms the missing ones one
after another, `warmup_s` each, while the worker keeps serving with the largest cap its
warmed buckets allow; lowering is instant and releases the buckets above the new cap (a
worker frees what it no longer serves, which is why warming is worth planning).

`WarmupTracker` is that state machine, on times passed in: the simulator runs one per
pool, and the live worker reports the same facts (warmed buckets, measured warm-up time).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from tidal_base.errors import InvalidInput


def bucket_for(size: int) -> int:
    """The smallest power-of-two bucket that holds `size` requests."""
    return 1 << max(0, size - 1).bit_length()


@functools.cache
def buckets_through(cap: int) -> tuple[int, ...]:
    """The buckets a worker needs warmed to serve batches of up to `cap`."""
    top = bucket_for(cap)
    return tuple(1 << i for i in range(top.bit_length()))


@functools.cache
def buckets_to_warm(warm_cap: int, cap: int) -> tuple[int, ...]:
    """The buckets missing to go from serving `warm_cap` to serving `cap`."""
    have = bucket_for(warm_cap)
    return tuple(b for b in buckets_through(cap) if b > have)


def warm_time_s(warm_cap: int, cap: int, warmup_s: float) -> float:
    """How long warming from `warm_cap` up to `cap` takes, one bucket after another."""
    return len(buckets_to_warm(warm_cap, cap)) * warmup_s


@dataclass(frozen=True, slots=True)
class WarmupStatus:
    """What a worker reports: buckets it can serve now, and those it is warming."""

    warmed: tuple[int, ...]
    warming: tuple[int, ...]

    @property
    def warm_cap(self) -> int:
        return self.warmed[-1]


class WarmupTracker:
    """Warmed buckets of a worker (or of a pool whose workers warm in step)."""

    def __init__(self, warmup_s: float, initial_cap: int) -> None:
        if not math.isfinite(warmup_s) or warmup_s < 0:
            raise InvalidInput(f"warmup must be a finite duration >= 0, got {warmup_s}")
        self.warmup_s = warmup_s
        self._warm_top = bucket_for(initial_cap)
        self._pending: list[tuple[int, float]] = []  # (bucket, ready_at), ascending

    def request(self, cap: int, now: float) -> None:
        """The cap the controller asked for: start warming, or release, accordingly."""
        self._advance(now)
        top = bucket_for(cap)
        if top <= self._warm_top:
            self._warm_top = top
            self._pending.clear()
            return
        self._pending = [(b, at) for b, at in self._pending if b <= top]
        start = self._pending[-1][1] if self._pending else now
        queued = {b for b, _ in self._pending}
        for bucket in buckets_to_warm(self._warm_top, cap):
            if bucket not in queued:
                start += self.warmup_s
                self._pending.append((bucket, start))

    def effective_cap(self, cap: int, now: float) -> int:
        """The cap a worker asked for `cap` can serve at `now`."""
        self._advance(now)
        return min(cap, self._warm_top)

    def status(self, now: float) -> WarmupStatus:
        self._advance(now)
        return WarmupStatus(buckets_through(self._warm_top), tuple(b for b, _ in self._pending))

    def _advance(self, now: float) -> None:
        while self._pending and self._pending[0][1] <= now:
            self._warm_top = self._pending.pop(0)[0]
