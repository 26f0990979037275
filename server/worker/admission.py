"""How many requests the worker lets wait: a queue bound chosen from the SLO.

An unbounded queue under overload serves nobody in time: each request waits behind every
earlier one (at 3.75x capacity the wait grew to 9.5 s), so the worker spends its
capacity on requests whose clients have given up, and goodput falls. So the worker sheds
at admission (429) once the queue holds what its instances clear within the SLO:

    bound = max(serving cap x instances, round(slo_s x service rate))

The service rate is measured over the last `WINDOW_BATCHES` batches: at the best batch
size among them, its requests over its execution seconds, times the instances running
side by side (`ServiceRate` says why not the rate served). A request admitted
at the bound leaves the queue about an SLO later, so what is served stays near the SLO
and what cannot be is refused at once, while the instances stay busy (goodput near
capacity). The floor keeps a full batch waiting for each instance, so shedding never
starves the batches; it is the whole bound until the first batch has run. Everything is
a function of the batches seen, so the bound is exact under a virtual clock.

`--max-queue N` replaces the rule with a fixed count, and `--max-queue none` leaves the
queue unbounded (a worker behind a client that waits as long as it takes).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from tidal_base.errors import InvalidInput

WINDOW_BATCHES = 32
"""Batches the service rate is measured over: a few hundred ms under load, so it follows a
config change quickly, and enough that one slow batch does not swing the bound."""


@dataclass(frozen=True, slots=True)
class QueueLimit:
    """What bounds the queue: `max_queue`, a fixed count; else `wait_s` (the SLO): what
    the measured service rate clears in that time; else nothing (unbounded)."""

    max_queue: int | None = None
    wait_s: float | None = None

    def __post_init__(self) -> None:
        if self.max_queue is not None and self.max_queue < 1:
            raise InvalidInput(f"max_queue must be >= 1, got {self.max_queue}")
        if self.wait_s is not None and not (math.isfinite(self.wait_s) and self.wait_s > 0):
            raise InvalidInput(f"wait_s must be a finite duration > 0, got {self.wait_s}")
        if self.max_queue is not None and self.wait_s is not None:
            raise InvalidInput("a queue limit is a fixed count or a wait, not both")

    @property
    def rule(self) -> str:
        """`fixed`, `slo` or `none`: which bound applies."""
        if self.max_queue is not None:
            return "fixed"
        return "slo" if self.wait_s is not None else "none"

    def bound(self, rate_rps: float | None, floor: int) -> int | None:
        """The most requests that may wait, given the measured service rate (None before
        any batch ran) and the floor (a full batch for each instance); None: unbounded."""
        if self.max_queue is not None:
            return self.max_queue
        if self.wait_s is None:
            return None
        if rate_rps is None:
            return floor
        return max(floor, round(self.wait_s * rate_rps))

    def explain(self, rate_rps: float | None, floor: int) -> str:
        """Why the bound is what it is, for a 429's message and the log."""
        bound = self.bound(rate_rps, floor)
        if self.rule == "fixed":
            return f"bound {bound} (--max-queue)"
        if self.rule == "none":
            return "unbounded"
        if rate_rps is None or bound == floor:
            return f"bound {bound} (a full batch per instance)"
        return f"bound {bound} (SLO {self.wait_s * 1e3:g} ms x {rate_rps:.0f} req/s served)"


class ServiceRate:
    """Requests per second the instances clear at the best batch size of their last
    `window` batches: for each size seen, its requests over its execution seconds, and
    the highest of those, times the instances.

    Not the rate served: at light load batches are small, and what small batches clear
    understates what the instances clear once the queue fills them (a model that takes
    40 ms a batch at cap 2 serves 25 req/s one by one, 50 in pairs), so a bound from the
    served rate shed requests at 30% of capacity. The best size seen is the nearest measured
    sign of capacity; under overload every batch is full and it is exact."""

    def __init__(self, instances: int, window: int = WINDOW_BATCHES) -> None:
        if instances < 1 or window < 1:
            raise InvalidInput(f"instances and window must be >= 1, got {instances}, {window}")
        self.instances = instances
        self._batches: deque[tuple[int, float]] = deque(maxlen=window)
        self._rate_rps: float | None = None

    @property
    def rate_rps(self) -> float | None:
        """None until a batch with a measurable execution time has run."""
        return self._rate_rps

    def record(self, size: int, execution_s: float) -> None:
        """One batch of `size` requests that ran for `execution_s` seconds."""
        self._batches.append((size, execution_s))
        requests: dict[int, int] = {}
        seconds: dict[int, float] = {}
        for n, s in self._batches:
            requests[n] = requests.get(n, 0) + n
            seconds[n] = seconds.get(n, 0.0) + s
        rates = [requests[n] / seconds[n] for n in requests if seconds[n] > 0]
        if rates:
            self._rate_rps = self.instances * max(rates)
