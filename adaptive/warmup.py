"""Warmed batch-size buckets: why a worker cannot raise its batch cap instantly.

Fast paths are prepared per batch size (CUDA Graph capture, TensorRT profiles, compiled
shapes). A worker keeps a set of warmed buckets, powers of two, and runs a batch padded
to the smallest warmed bucket that holds it. Serving a cap needs every bucket up to
`bucket_for(cap)`. Raising the cap past the warmed buckets warms the missing ones one
after another, `warmup_s` each, while the worker keeps serving with the largest cap its
warmed buckets allow; lowering is instant and releases the buckets above the new cap (a
worker frees what it no longer serves, which is why warming is worth planning).

`WarmupTracker` is that state machine, on times passed in: the simulator runs one per
pool, with a modelled `warmup_s`; the live worker runs one with `warmup_s=None`, where a
bucket becomes warm when its real (measured) warm-up finishes (`mark_warm`), so both
shells follow the same rules.
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
    """The buckets missing to go from serving `warm_cap` to serving `cap`; a `warm_cap`
    of 0 (nothing warm, a fresh replica) misses every bucket, 1 included."""
    have = bucket_for(warm_cap) if warm_cap else 0
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
        """The largest warmed bucket; 0 while nothing is warm."""
        return self.warmed[-1] if self.warmed else 0


class WarmupTracker:
    """Warmed buckets of a worker (or of a pool whose workers warm in step).

    warmup_s: seconds each bucket takes to warm; None when warm-ups are measured (a live
        worker): a pending bucket then becomes warm only when `mark_warm` says so.
    initial_cap: the cap whose buckets are warm at the start; 0 for nothing warm.
    """

    def __init__(self, warmup_s: float | None, initial_cap: int) -> None:
        if warmup_s is not None and (not math.isfinite(warmup_s) or warmup_s < 0):
            raise InvalidInput(f"warmup must be a finite duration >= 0, got {warmup_s}")
        if initial_cap < 0:
            raise InvalidInput(f"initial_cap must be >= 0, got {initial_cap}")
        self.warmup_s = warmup_s
        self._warm_top = bucket_for(initial_cap) if initial_cap else 0
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
        step_s = math.inf if self.warmup_s is None else self.warmup_s  # measured: unknown
        for bucket in self._missing(cap):
            if bucket not in queued:
                start += step_s
                self._pending.append((bucket, start))

    def mark_warm(self, bucket: int, now: float) -> bool:
        """A measured warm-up of `bucket` finished at `now`: it is warm if it is the
        bucket being warmed (the next pending one); False if it was released meanwhile."""
        self._advance(now)
        if not self._pending or self._pending[0][0] != bucket:
            return False
        self._warm_top = self._pending.pop(0)[0]
        return True

    def abandon(self, now: float) -> None:
        """Stop warming (a warm-up failed): pending buckets are dropped, warm ones stay."""
        self._advance(now)
        self._pending.clear()

    def effective_cap(self, cap: int, now: float) -> int:
        """The cap a worker asked for `cap` can serve at `now`."""
        self._advance(now)
        return min(cap, self._warm_top)

    def status(self, now: float) -> WarmupStatus:
        """The buckets warm at `now` (every power of two up to the largest) and those still pending,
        in the order they warm."""
        self._advance(now)
        warmed = buckets_through(self._warm_top) if self._warm_top else ()
        return WarmupStatus(warmed, tuple(b for b, _ in self._pending))

    def _missing(self, cap: int) -> tuple[int, ...]:
        return buckets_to_warm(self._warm_top, cap)

    def _advance(self, now: float) -> None:
        while self._pending and self._pending[0][1] <= now:
            self._warm_top = self._pending.pop(0)[0]
