"""One pool's live control loop: worker stats from the bus, the `Controller`, configs out.

The `Controller` is the simulator's, unchanged: it runs on a wall clock against an
in-process bus, and this shell moves messages between that bus and the pool's `PoolBus`
(Redis, or in-process for one machine) each tick.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from adaptive.bus import VersionedConfig, WorkerStats, pool_stats
from adaptive.controller import Controller
from adaptive.decisions import DecisionRecord
from server.bus.protocols import PoolBus

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


TickObserver = Callable[["ControlLoop", DecisionRecord | None], None]
SettingsSync = Callable[[bool], Awaitable[None]]
TRIM_EVERY_TICKS = 600


class ControlLoop:
    def __init__(
        self,
        controller: Controller,
        bus: PoolBus,
        holder: str,
        lease_s: float = 3.0,
        observer: TickObserver | None = None,
        sync_settings: SettingsSync | None = None,
    ) -> None:
        self.controller = controller
        self.bus = bus
        self.pool = controller.settings.pool
        self.holder = holder
        self.lease_s = lease_s
        self.observer = observer
        # Operators' settings live on the bus: standbys follow them every tick, a new
        # leader takes them (or restores them to a bus that lost them) before it acts.
        self.sync_settings = sync_settings
        self.state = LoopState()
        self.latest: dict[str, WorkerStats] = {}  # each worker's last report
        # The highest config version seen stored or running on a worker: a leader's next
        # version goes above it, even when Redis lost what it stored (workers apply only
        # newer versions, so publishing below what they run would be ignored).
        self._seen_version = 0
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
            except Exception as error:  # a bug must not end control silently
                failures += 1
                log.exception("tick failed on pool %s", self.pool)
                self.state.ready, self.state.last_error = False, f"tick failed: {error!r}"
                await asyncio.sleep(min(tick_s * 2**failures, 10.0))
                continue
            await asyncio.sleep(max(0.0, tick_s - (time.monotonic() - started)))

    async def tick(self) -> None:
        started = time.monotonic()
        await self._elect()
        if self._cursor == "$":
            self._cursor = await self.bus.last_stats_id(self.pool)
        reports, self._cursor, _bad = await self.bus.read_worker_stats(self.pool, self._cursor)
        alive = await self.bus.workers_alive(self.pool)
        self.state.workers_alive = len(alive)
        self._seen_version = max(
            self._seen_version,
            *(r.config_version for r in reports),
            *(info.get("config_version", 0) for info in alive.values()),
        )
        self.latest.update((r.worker, r) for r in reports)
        for gone in set(self.latest) - set(alive):
            del self.latest[gone]
        if reports:
            # Worker windows are not aligned with ticks: a tick may hold two windows of
            # one worker, and every arrival counts.
            merged = pool_stats(reports, self.controller.clock.now(), len(alive) or 1)
            # The controller reads its own in-process bus (a policy switch brings a new one).
            self.controller.bus.publish_stats(self.pool, merged)
        controller = self.controller
        record = controller.tick()
        if self.state.leader:
            if controller.version > self.state.published_version:
                await self._publish()
            if record is not None and controller.records and controller.records[-1] is record:
                await self.bus.record_decision(self.pool, {"time": time.time(), **record.to_dict()})
            if self.state.ticks % TRIM_EVERY_TICKS == 0:
                await self.bus.trim_history(self.pool, int(time.time()))
        self.state.ready = True
        self.state.ticks += 1
        self.state.last_tick_s = time.monotonic() - started
        if self.observer is not None:
            self.observer(self, record)

    async def _elect(self) -> None:
        leading = await self.bus.acquire_or_renew_lease(self.pool, self.holder, self.lease_s)
        elected = leading and not self.state.leader
        if self.sync_settings is not None and (elected or not leading):
            await self.sync_settings(elected)
        if not leading:
            stored = await self.bus.current_config(self.pool)
            if stored is not None:
                self._seen_version = max(self._seen_version, stored.version)
        if elected:
            await self._adopt()
            log.info("%s leads pool %s", self.holder, self.pool)
        self.state.leader = leading

    async def _adopt(self) -> None:
        """Start from the config in force and above its version; if the bus holds none
        or an older one (a Redis that lost its data), publish ours so workers find it."""
        current = await self.bus.current_config(self.pool)
        newest = max(self.controller.version, self._seen_version)
        if current is not None and current.version >= newest:
            self.controller.adopt(current.config, current.version)
            self.state.published_version = current.version
        else:
            await self._publish()

    async def _publish(self) -> None:
        current = await self.bus.current_config(self.pool)
        floor = max(current.version if current else 0, self._seen_version)
        version = max(self.controller.version, floor + 1)
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
