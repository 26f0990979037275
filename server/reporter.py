"""The worker's side of the bus: stats out every second, newer configs in.

Each interval the reporter publishes a `WorkerStats` (arrivals, completions, sheds, a
latency histogram, batch sizes, busy seconds, queue depth, warmed buckets, the config
version in force) and reads the pool's config from the bus, applying it only if its
version is newer than the one running, so a missed or repeated message never moves a
worker backwards. It reads the config on its first tick too: a worker that (re)joins
picks up the pool's current config.
"""

from __future__ import annotations

import asyncio
import contextlib

import numpy as np

from adaptive.bus import Bus, WorkerStats
from adaptive.histogram import LatencyHistogram
from server.batching import DynamicBatcher


class StatsReporter:
    def __init__(
        self, batcher: DynamicBatcher, bus: Bus, pool: str, worker: str, interval_s: float = 1.0
    ) -> None:
        self.batcher = batcher
        self.bus = bus
        self.pool = pool
        self.worker = worker
        self.interval_s = interval_s
        self._last = (0, 0, 0, 0.0)  # arrivals, completed, shed, busy seconds
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
            self.apply_newer_config()
            await asyncio.sleep(self.interval_s)
            self.report()

    def apply_newer_config(self) -> bool:
        published = self.bus.current_config(self.pool)
        if published is None or published.version <= self.batcher.version:
            return False
        self.batcher.reconfigure(published.config, published.version)
        return True

    def report(self) -> WorkerStats:
        s = self.batcher.stats
        arrivals, completed, shed, busy_s = self._last
        latencies, batch_sizes = self.batcher.take_window()
        histogram = LatencyHistogram.from_samples(np.array(latencies))
        nonzero = np.flatnonzero(histogram.counts)
        stats = WorkerStats(
            worker=self.worker,
            window_s=self.interval_s,
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
        self._last = (s.arrivals, s.completed, s.shed, s.busy_s)
        self.bus.publish_worker_stats(self.pool, stats)
        return stats
