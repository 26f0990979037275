"""What a `@tidal_batch` handler served, counted in the handler itself.

Ray's export-port histograms rebuild `_sum` from bucket midpoints, so their means are
not exact; the handler sees every call and every batch, so it counts: arrivals (calls),
completions, exact batch sizes, each request's queue wait (from its call to its batch
starting), each batch's execution time (`busy_s`), latency (queue wait + execution), and
the queue depth (called, not yet in a batch that started). Totals run from the
replica's start; `take_window` hands over what was served since the last window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """How one request was served: what `timed_call` returns beside the result."""

    queue_wait_s: float
    execution_s: float
    batch_size: int
    max_batch_size: int  # the cap in force when its batch started
    config_version: int


class QueuedCall:
    """One call on its way through Ray's batch queue (the same object reaches the batch
    handler, so its stamps travel with it)."""

    __slots__ = ("called_at", "instance", "payload", "started", "timing")

    def __init__(self, instance: Any, payload: Any, called_at: float) -> None:
        self.instance = instance
        self.payload = payload
        self.called_at = called_at
        self.started = False
        self.timing: BatchTiming | None = None


@dataclass(frozen=True, slots=True)
class Window:
    """What was served since the last window, as the handler counted it."""

    latencies_s: list[float]
    queue_waits_s: list[float]
    batch_sizes: dict[int, int]

    def queue_wait_summary_ms(self) -> dict[str, float] | None:
        """Mean, median and p99 of the window's queue waits in ms; None if none."""
        if not self.queue_waits_s:
            return None
        values = np.array(self.queue_waits_s) * 1e3
        return {
            "mean": round(float(values.mean()), 3),
            "p50": round(float(np.quantile(values, 0.5)), 3),
            "p99": round(float(np.quantile(values, 0.99)), 3),
        }


class BatchCounters:
    """Totals since the replica started, and the window since the last `take_window`.

    Every call is one arrival; it waits until its batch starts (or it is cancelled
    first), then completes or fails with its batch. Ray's batch loop and this run on the
    replica's one event loop, so no locking is needed."""

    def __init__(self) -> None:
        self.arrivals = 0
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.batches = 0
        self.busy_s = 0.0
        self.waiting = 0
        self._window = Window([], [], {})

    def arrived(self) -> None:
        self.arrivals += 1
        self.waiting += 1

    def left_unserved(self) -> None:
        """A call that went away (cancelled) before its batch started."""
        self.waiting -= 1
        self.cancelled += 1

    def started(self, calls: list[QueuedCall], now: float) -> None:
        self.waiting -= len(calls)
        for call in calls:
            call.started = True
        self._window.queue_waits_s.extend(now - c.called_at for c in calls)

    def finished(self, calls: list[QueuedCall], started_at: float, now: float, ok: bool) -> None:
        self.batches += 1
        self.busy_s += now - started_at
        if not ok:
            self.failed += len(calls)
            return
        self.completed += len(calls)
        sizes = self._window.batch_sizes
        sizes[len(calls)] = sizes.get(len(calls), 0) + 1
        self._window.latencies_s.extend(now - c.called_at for c in calls)

    def take_window(self) -> Window:
        window, self._window = self._window, Window([], [], {})
        return window
