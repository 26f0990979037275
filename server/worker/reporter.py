"""What a worker tells the pool, and the one rule for what it takes from it.

`StatsCollector` turns the batcher's counters into one `WorkerStats` per window
(arrivals, completions, sheds, a latency histogram, batch sizes, busy seconds, queue
depth, warmed buckets, the config version in force, execution times by padded size,
the time requests took from the socket to the batcher),
each covering the seconds measured on the batcher's clock since the last one.
`apply_if_newer` runs a published config only if its version is newer than the one
running, so a missed or repeated message never moves a worker backwards.
`server/worker/link.py` carries both over the bus (Redis, or in-process).
"""

from __future__ import annotations

import numpy as np

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.clock import Clock
from adaptive.histogram import LatencyHistogram
from adaptive.learned_latency import ExecutionTimes
from server.worker.batching import DynamicBatcher


class StatsCollector:
    """Counters since the last window, as a `WorkerStats`.

    A window covers the seconds since the previous `collect` (or `begin`) on `clock`
    (the batcher's by default), so a short last window at shutdown is not read as a
    lull; before `begin`, the first window counts as the nominal `window_s`."""

    def __init__(
        self, batcher: DynamicBatcher, worker: str, window_s: float, clock: Clock | None = None
    ) -> None:
        self.batcher = batcher
        self.worker = worker
        self.window_s = window_s
        self.clock = clock if clock is not None else batcher.clock
        self._last = (0, 0, 0, 0.0)  # arrivals, completed, shed, busy seconds
        self._window_started_at: float | None = None
        batcher.keep_windows()

    def begin(self) -> None:
        """Start the first window now."""
        self._window_started_at = self.clock.now()

    def collect(self) -> WorkerStats:
        s = self.batcher.stats
        arrivals, completed, shed, busy_s = self._last
        latencies, batch_sizes = self.batcher.take_window()
        execution = self.batcher.take_execution_window()
        ingress = LatencyHistogram.from_samples(np.array(self.batcher.take_ingress_window()))
        histogram = LatencyHistogram.from_samples(np.array(latencies))
        nonzero = np.flatnonzero(histogram.counts)
        self._last = (s.arrivals, s.completed, s.shed, s.busy_s)
        return WorkerStats(
            worker=self.worker,
            window_s=self._measure_window_s(),
            arrivals=s.arrivals - arrivals,
            completed=s.completed - completed,
            shed=s.shed - shed,
            latency_buckets=tuple((int(i), int(histogram.counts[i])) for i in nonzero),
            latency_sum_s=histogram.sum_s,
            batch_sizes=tuple(sorted(batch_sizes.items())),
            busy_s=s.busy_s - busy_s,
            queue_depth=self.batcher.queue_depth,
            max_batch_size=self.batcher.serving_cap,
            warmed_buckets=self.batcher.warmed_buckets,
            config_version=self.batcher.version,
            ingress_buckets=tuple(
                (int(i), int(ingress.counts[i])) for i in np.flatnonzero(ingress.counts)
            ),
            ingress_sum_s=ingress.sum_s,
            execution=tuple(
                ExecutionTimes.from_samples(size, samples)
                for size, samples in sorted(execution.items())
            ),
        )

    def _measure_window_s(self) -> float:
        now = self.clock.now()
        started_at, self._window_started_at = self._window_started_at, now
        return self.window_s if started_at is None else now - started_at


def apply_if_newer(batcher: DynamicBatcher, published: VersionedConfig | None) -> bool:
    """Run `published` if it is newer than what the batcher runs."""
    if published is None or published.version <= batcher.version:
        return False
    batcher.reconfigure(published.config, published.version)
    return True
