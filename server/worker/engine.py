"""Tidal's own worker as an `Engine` (`server.engines.protocols`): its `DynamicBatcher`,
steered in process.

It lives in the worker's room, beside what it adapts: `server.engines` holds the seam,
the pool membership every engine joins through and the adapters of engines Tidal does
not run itself (Ray Serve, Triton), and imports nothing of the worker, whose link
imports the membership (an adapter there closed a circle: worker -> engines -> worker).

A config applies at once (the batcher reconfigures between batches); raising the cap
warms the missing buckets, measured, while the old cap serves, so the change cost is a
warm-up per bucket: the mean of the warm-ups this worker has measured (0 until one ran).
Its status says whether it is ready with the answer its /readyz gives
(`server.worker.readiness`): not while the starting config's buckets warm (it would serve
at a partial cap), while its front ends connect, or once its dispatch loop died.
"""

from __future__ import annotations

from typing import Any

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.change_cost import ChangeCost
from server.worker.batching import DynamicBatcher
from server.worker.readiness import Frontends, not_ready
from server.worker.reporter import StatsCollector, apply_if_newer


class TidalWorkerEngine:
    kind = "tidal-worker"

    def __init__(
        self,
        batcher: DynamicBatcher,
        worker: str,
        window_s: float,
        frontends: Frontends | None = None,
    ) -> None:
        self.batcher = batcher
        self.frontends = frontends
        self.collector = StatsCollector(batcher, worker, window_s)

    @property
    def version(self) -> int:
        return self.batcher.version

    @property
    def change_cost(self) -> ChangeCost:
        measured = self.batcher.stats.warmup_s
        mean_s = sum(measured.values()) / len(measured) if measured else 0.0
        return ChangeCost(warmup_per_bucket_s=mean_s)

    async def apply(self, published: VersionedConfig) -> None:
        apply_if_newer(self.batcher, published)

    async def collect(self) -> WorkerStats:
        return self.collector.collect()

    def status(self) -> dict[str, Any]:
        not_ready = self.not_ready()
        return {
            "ready": not_ready is None,
            "not_ready": not_ready,
            "warmed_buckets": list(self.batcher.warmed_buckets),
            "queue_depth": self.batcher.queue_depth,
            "serving_max_batch": self.batcher.serving_cap,
        }

    def not_ready(self) -> str | None:
        """Why the worker cannot take its share of traffic, or None when it can."""
        return not_ready(self.batcher, self.frontends)
