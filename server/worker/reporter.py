"""The worker's side of the bus: stats out every second, newer configs in.

`StatsCollector` turns the batcher's counters into one `WorkerStats` per window
(arrivals, completions, sheds, a latency histogram, batch sizes, busy seconds, queue
depth, warmed buckets, the config version in force). `StatsReporter` publishes them on
an in-process `Bus` and applies the pool's config when its version is newer than the
one running, so a missed or repeated message never moves a worker backwards; it reads
the config on its first tick too, so a worker that (re)joins picks up the pool's config.
(`server/worker/link.py` does the same over Redis.)
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from adaptive.bus import Bus, VersionedConfig, WorkerStats
from adaptive.histogram import LatencyHistogram
from server.worker.batching import DynamicBatcher


class StatsCollector:
    """Counters since the last window, as a `WorkerStats`."""

    def __init__(self, batcher: DynamicBatcher, worker: str, window_s: float) -> None:
        self.batcher = batcher
        self.worker = worker
        self.window_s = window_s
        self._last = (0, 0, 0, 0.0)  # arrivals, completed, shed, busy seconds

    def collect(self) -> WorkerStats:
        s = self.batcher.stats
        arrivals, completed, shed, busy_s = self._last
        latencies, batch_sizes = self.batcher.take_window()
        histogram = LatencyHistogram.from_samples(np.array(latencies))
        nonzero = np.flatnonzero(histogram.counts)
        self._last = (s.arrivals, s.completed, s.shed, s.busy_s)
        return WorkerStats(
            worker=self.worker,
            window_s=self.window_s,
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
        )


def apply_if_newer(batcher: DynamicBatcher, published: VersionedConfig | None) -> bool:
    """Run `published` if it is newer than what the batcher runs."""
    if published is None or published.version <= batcher.version:
        return False
    batcher.reconfigure(published.config, published.version)
    return True


class StatsReporter:
    """Publishes on an in-process bus every interval; applies newer pool configs."""

    def __init__(
        self, batcher: DynamicBatcher, bus: Bus, pool: str, worker: str, interval_s: float = 1.0
    ) -> None:
        self.batcher = batcher
        self.bus = bus
        self.pool = pool
        self.interval_s = interval_s
        self.collector = StatsCollector(batcher, worker, interval_s)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="stats-reporter")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.report()  # the last partial window

    async def _loop(self) -> None:
        while True:
            apply_if_newer(self.batcher, self.bus.current_config(self.pool))
            await asyncio.sleep(self.interval_s)
            self.report()

    def report(self) -> WorkerStats:
        stats = self.collector.collect()
        self.bus.publish_worker_stats(self.pool, stats)
        return stats
