"""The bus seam: how pool statistics reach the controller and configs reach workers.

The controller and the workers never call each other; they publish and read through a
`Bus`. In-process (the simulator, one-machine runs, tests) that is `InMemoryBus`; across
machines it is Redis (`server/`). Configs carry a version that only grows, so a worker
can ignore anything older than what it runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from adaptive.config import BatchConfig
from adaptive.histogram import NUM_BUCKETS, quantile_from_counts
from adaptive.policy import Observation
from adaptive.warmup import WarmupStatus


@dataclass(frozen=True, slots=True)
class VersionedConfig:
    version: int
    config: BatchConfig


@dataclass(frozen=True, slots=True)
class PoolStats:
    """What a pool's workers report for one control tick."""

    observation: Observation
    warmup: WarmupStatus | None = None
    config_version: int = 0


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """What one live worker did over one reporting window (it reports every second).

    Latencies are sparse `adaptive.histogram` bucket counts, so a pool's reports merge
    exactly into one histogram; batch sizes are (size, batches) pairs.
    """

    worker: str
    window_s: float
    arrivals: int
    completed: int
    shed: int
    latency_buckets: tuple[tuple[int, int], ...]
    latency_sum_s: float
    batch_sizes: tuple[tuple[int, int], ...]
    busy_s: float
    queue_depth: int
    max_batch_size: int
    warmed_buckets: tuple[int, ...]
    config_version: int


def pool_stats(reports: Sequence[WorkerStats], ended_at: float, workers: int) -> PoolStats:
    """Merge one window's worker reports into the pool's `Observation` for the controller.

    Warmed buckets are those every reporting worker has warm (the pool can rely on no
    more), and the config version is the oldest still running."""
    window_s = max((r.window_s for r in reports), default=1.0)
    counts = np.zeros(NUM_BUCKETS, dtype=np.int64)
    for report in reports:
        for bucket, count in report.latency_buckets:
            counts[bucket] += count
    batches = sum(n for r in reports for _, n in r.batch_sizes)
    size_sum = sum(size * n for r in reports for size, n in r.batch_sizes)
    fill_sum = sum(size / r.max_batch_size * n for r in reports for size, n in r.batch_sizes)
    busy_s = sum(r.busy_s for r in reports)
    observation = Observation(
        ended_at=ended_at,
        window_s=window_s,
        arrivals=sum(r.arrivals for r in reports),
        completed=sum(r.completed for r in reports),
        shed=sum(r.shed for r in reports),
        queue_depth=sum(r.queue_depth for r in reports),
        latency_p50_s=quantile_from_counts(counts, 0.5),
        latency_p99_s=quantile_from_counts(counts, 0.99),
        mean_batch_size=size_sum / batches if batches else None,
        batch_fill_ratio=fill_sum / batches if batches else None,
        utilization=busy_s / (max(workers, 1) * window_s),
        batches=batches,
        busy_s=busy_s,
    )
    warm = min((r.warmed_buckets for r in reports if r.warmed_buckets), key=len, default=())
    version = min((r.config_version for r in reports), default=0)
    return PoolStats(observation, WarmupStatus(warm, ()) if warm else None, version)


class Bus(Protocol):
    def publish_config(self, pool: str, config: VersionedConfig) -> None: ...

    def current_config(self, pool: str) -> VersionedConfig | None: ...

    def publish_stats(self, pool: str, stats: PoolStats) -> None: ...

    def take_stats(self, pool: str) -> PoolStats | None:
        """The latest stats since the last take, or None if none arrived."""
        ...

    def publish_worker_stats(self, pool: str, stats: WorkerStats) -> None: ...

    def take_worker_stats(self, pool: str) -> list[WorkerStats]:
        """Every worker report since the last take, oldest first."""
        ...


class InMemoryBus:
    """A bus inside one process."""

    def __init__(self) -> None:
        self._configs: dict[str, VersionedConfig] = {}
        self._stats: dict[str, PoolStats] = {}
        self._worker_stats: dict[str, list[WorkerStats]] = {}

    def publish_config(self, pool: str, config: VersionedConfig) -> None:
        held = self._configs.get(pool)
        if held is None or config.version > held.version:
            self._configs[pool] = config

    def current_config(self, pool: str) -> VersionedConfig | None:
        return self._configs.get(pool)

    def publish_stats(self, pool: str, stats: PoolStats) -> None:
        self._stats[pool] = stats

    def take_stats(self, pool: str) -> PoolStats | None:
        return self._stats.pop(pool, None)

    def publish_worker_stats(self, pool: str, stats: WorkerStats) -> None:
        self._worker_stats.setdefault(pool, []).append(stats)

    def take_worker_stats(self, pool: str) -> list[WorkerStats]:
        return self._worker_stats.pop(pool, [])
