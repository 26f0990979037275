"""One pool's live control loop: worker stats from Redis, the `Controller`, configs to Redis.

The `Controller` is the simulator's, unchanged: it runs on a wall clock against an
in-process bus, and this shell moves messages between that bus and Redis each tick.
Controllers of one pool elect a leader with a lease (SET NX PX, renewed every tick);
only the leader publishes. A new leader adopts the config in force from Redis, and every
version it publishes is above the one stored, so versions never go backwards across a
failover. If Redis goes away the loop reports not-ready, keeps its state, retries with
backoff, and resynchronises when Redis returns; workers meanwhile keep their config.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from redis.exceptions import RedisError

from adaptive.bus import InMemoryBus, VersionedConfig, pool_stats
from adaptive.controller import Controller
from server.redis_bus import RedisBus

log = logging.getLogger("tidal.controller")


@dataclass
class LoopState:
    """What the API and metrics report about the loop."""

    leader: bool = False
    ready: bool = False
    ticks: int = 0
    published_version: int = 0
    workers_alive: int = 0
    last_tick_s: float = 0.0
    last_error: str | None = None


class ControlLoop:
    def __init__(
        self,
        controller: Controller,
        local: InMemoryBus,
        bus: RedisBus,
        holder: str,
        lease_s: float = 3.0,
    ) -> None:
        self.controller = controller
        self.local = local
        self.bus = bus
        self.pool = controller.settings.pool
        self.holder = holder
        self.lease_s = lease_s
        self.state = LoopState()
        self._cursor = "$"  # only stats that arrive from now on

    async def run(self) -> None:
        """Tick every `settings.tick_s` until cancelled; Redis errors back off, never raise."""
        tick_s = self.controller.settings.tick_s
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await self.tick()
                failures = 0
            except (RedisError, OSError) as error:
                failures += 1
                self._lost(error)
                await asyncio.sleep(min(tick_s * 2**failures, 10.0))
                continue
            await asyncio.sleep(max(0.0, tick_s - (time.monotonic() - started)))

    async def tick(self) -> None:
        started = time.monotonic()
        await self._elect()
        if self._cursor == "$":
            self._cursor = await self.bus.last_stats_id(self.pool)
        reports, self._cursor = await self.bus.read_worker_stats(self.pool, self._cursor)
        alive = await self.bus.workers_alive(self.pool)
        self.state.workers_alive = len(alive)
        if reports:
            # Each worker reports once per window; merge the latest window per worker.
            latest = {r.worker: r for r in reports}
            merged = pool_stats(list(latest.values()), self.controller.clock.now(), len(alive) or 1)
            self.local.publish_stats(self.pool, merged)
        record = self.controller.tick()
        if self.state.leader and self.controller.version > self.state.published_version:
            await self._publish()
            if record is not None:
                await self.bus.record_decision(self.pool, record.to_dict())
        self.state.ready = True
        self.state.ticks += 1
        self.state.last_tick_s = time.monotonic() - started

    async def _elect(self) -> None:
        leading = await self.bus.acquire_or_renew_lease(self.pool, self.holder, self.lease_s)
        if leading and not self.state.leader:
            await self._adopt()
            log.info("%s leads pool %s", self.holder, self.pool)
        self.state.leader = leading

    async def _adopt(self) -> None:
        """Start from the config in force and above its version."""
        current = await self.bus.current_config(self.pool)
        if current is not None:
            self.controller.adopt(current.config, current.version)
            self.state.published_version = current.version

    async def _publish(self) -> None:
        current = await self.bus.current_config(self.pool)
        version = max(self.controller.version, (current.version + 1) if current else 1)
        self.controller.version = version
        config = VersionedConfig(version, self.controller.config)
        if await self.bus.publish_config(self.pool, config):
            self.state.published_version = version

    def _lost(self, error: Exception) -> None:
        if self.state.ready:
            log.warning("redis unreachable (%s); keeping state, retrying", error)
        self.state.ready = False
        self.state.leader = False
        self.state.last_error = str(error)
