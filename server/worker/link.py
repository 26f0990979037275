"""A worker's membership of a pool on a `PoolBus` (Redis, or in-process), fail-static.

Every interval it publishes the worker's `WorkerStats` and a heartbeat (a key with a
TTL: a worker that stops beating leaves the pool). It applies the pool's config when a
newer version is announced, and reads the config hash whenever it (re)connects, so a
missed notification is never a missed config. If Redis goes away the worker keeps
serving with its last config and its queue; stats are kept (bounded) and sent when
Redis returns, and the link retries with exponential backoff. Any other failure in
either loop is logged with its traceback and counted
(`tidal_worker_background_errors_total{task="link-report"|"link-config"}`), and the
loop goes on. Reports fall due at fixed instants on the link's clock (the batcher's),
`interval_s` apart, so a slow publish does not make the windows drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

from redis.exceptions import RedisError

from adaptive.bus import WorkerStats
from adaptive.clock import Clock
from server.bus.protocols import PoolBus
from server.tasks import cancel_and_wait
from server.worker.background import spawn
from server.worker.batching import DynamicBatcher
from server.worker.reporter import StatsCollector, apply_if_newer

log = logging.getLogger("tidal.worker")

BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class WorkerLink:
    def __init__(
        self,
        batcher: DynamicBatcher,
        bus: PoolBus,
        pool: str,
        worker: str,
        interval_s: float = 1.0,
        heartbeat_ttl_s: float = 3.0,
        max_unsent: int = 3600,
        clock: Clock | None = None,
    ) -> None:
        self.batcher = batcher
        self.clock = clock if clock is not None else batcher.clock
        self.bus = bus
        self.pool = pool
        self.worker = worker
        self.interval_s = interval_s
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.collector = StatsCollector(batcher, worker, interval_s, self.clock)
        self.unsent: deque[WorkerStats] = deque(maxlen=max_unsent)
        self.connected = False
        self.configs_applied = 0
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self.collector.begin()
        errors = self.batcher.errors
        self._tasks = [
            spawn(self._report_loop(), "link-report", errors),
            spawn(self._config_loop(), "link-config", errors),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel_and_wait(task)
        self.unsent.append(self.collector.collect())
        with contextlib.suppress(RedisError, OSError):
            await self._flush()

    async def _report_loop(self) -> None:
        due_at = self.clock.now()
        while True:
            due_at += self.interval_s
            await asyncio.sleep(max(0.0, due_at - self.clock.now()))
            self.unsent.append(self.collector.collect())
            try:
                await self._flush()
                await self.bus.heartbeat(self.pool, self.worker, self._info(), self.heartbeat_ttl_s)
            except (RedisError, OSError) as error:
                self._lost(error)
            except Exception as error:  # a bug, not an outage: loud, counted, carry on
                self.batcher.errors.record("link-report", error)

    async def _flush(self) -> None:
        while self.unsent:
            await self.bus.publish_worker_stats(self.pool, self.unsent[0])
            self.unsent.popleft()  # only once it is stored: nothing lost, nothing twice

    async def _config_loop(self) -> None:
        attempt = 0
        while True:
            try:
                notices = await self.bus.subscribe_configs(self.pool)
                try:
                    await self._sync_config()  # after subscribing: no change slips between
                    self.connected, attempt = True, 0
                    async for _message in notices.listen():
                        await self._sync_config()
                finally:
                    with contextlib.suppress(RedisError, OSError):
                        await notices.aclose()
            except (RedisError, OSError) as error:
                self._lost(error)
            except Exception as error:  # a bug, not an outage: loud, counted, retried
                self.batcher.errors.record("link-config", error)
            await asyncio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            attempt += 1

    async def _sync_config(self) -> None:
        if apply_if_newer(self.batcher, await self.bus.current_config(self.pool)):
            self.configs_applied += 1

    def _lost(self, error: Exception) -> None:
        if self.connected:
            log.warning(
                "redis unreachable (%s); serving with config v%d", error, self.batcher.version
            )
        self.connected = False

    def _info(self) -> dict:
        return {
            "time": time.time(),
            "config_version": self.batcher.version,
            "warmed_buckets": list(self.batcher.warmed_buckets),
            "queue_depth": self.batcher.queue_depth,
            "serving_max_batch": self.batcher.serving_cap,
        }
