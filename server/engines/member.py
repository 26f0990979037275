"""Any engine's membership of a pool on a `PoolBus` (Redis, or in-process), fail-static.

Every interval it publishes the engine's `WorkerStats` and a heartbeat (a key with a
TTL: a member that stops beating leaves the pool). It applies the pool's config when a
newer version is announced, and reads the config hash whenever it (re)connects, so a
missed notification is never a missed config. If Redis goes away the engine keeps
serving with its last config; stats are kept (bounded) and sent when Redis returns, and
the member retries with exponential backoff. A config the engine refuses
(`ConfigRejected`) is logged once, shown in the heartbeat (`rejected`) and not retried
until a newer version comes; the old config keeps serving. An engine that does not
answer (`EngineUnreachable`: Triton down or restarting) is an outage, not a bug: logged
once when it begins and once when it ends, and the heartbeats go on with the member not
ready and why (`ready`, `not_ready`), so the pool sees a member it cannot use rather
than one that vanished; configs are retried with the backoff. Any other failure in
either loop is logged with its traceback and counted (`errors`, by task "link-report"
or "link-config"), and the loop goes on. Reports fall due at fixed instants on the
member's clock, `interval_s` apart, so a slow publish does not make the windows drift.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import asdict
from typing import Any

from redis.exceptions import RedisError

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.clock import Clock
from server.bus.protocols import WorkerBus
from server.engines.protocols import ConfigRejected, Engine
from server.tasks import BackgroundErrors, cancel_and_wait, spawn
from tidal_base.errors import TidalError

log = logging.getLogger("tidal.member")

BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class EngineUnreachable(TidalError):
    """The engine did not answer (down, restarting, a wrong address): raised by an
    engine's `collect` or `apply`. The engine's next window that does answer covers the
    time it was away."""


class PoolMember:
    """Carries one engine's stats to its pool and the pool's configs to the engine."""

    def __init__(
        self,
        engine: Engine,
        bus: WorkerBus,
        pool: str,
        name: str,
        clock: Clock,
        errors: BackgroundErrors,
        interval_s: float = 1.0,
        heartbeat_ttl_s: float = 3.0,
        max_unsent: int = 3600,
    ) -> None:
        self.engine = engine
        self.bus = bus
        self.pool = pool
        self.name = name
        self.clock = clock
        self.errors = errors
        self.interval_s = interval_s
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.unsent: deque[WorkerStats] = deque(maxlen=max_unsent)
        self.connected = False
        self.configs_applied = 0
        self._leaving = False  # a drain began: no more heartbeats
        self.rejected: dict[str, Any] | None = None  # the last config the engine refused
        self.unreachable: str | None = None  # why the engine does not answer, while it does not
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [
            spawn(self._report_loop(), "link-report", self.errors),
            spawn(self._config_loop(), "link-config", self.errors),
        ]

    async def leave(self) -> None:
        """Leave the pool now (a drain begins): no more heartbeats, and the controller
        counts the member gone at its next read, not when the last beat expires. Stats
        keep flowing until `stop`, so the drained requests are still reported."""
        self._leaving = True
        with contextlib.suppress(RedisError, OSError):  # unreachable: the beat expires
            await self.bus.leave(self.pool, self.name)

    async def stop(self) -> None:
        """Stop both loops and send what is left, the last window included."""
        for task in self._tasks:
            await cancel_and_wait(task)
        await self._collect()
        with contextlib.suppress(RedisError, OSError):
            await self._flush()
            if self._leaving:
                await self.bus.leave(self.pool, self.name)  # a beat that raced the leave

    async def _report_loop(self) -> None:
        due_at = self.clock.now()
        while True:
            due_at += self.interval_s
            await asyncio.sleep(max(0.0, due_at - self.clock.now()))
            try:
                await self._collect()
                await self._flush()
                if not self._leaving:
                    await self.bus.heartbeat(
                        self.pool, self.name, self.info(), self.heartbeat_ttl_s
                    )
            except (RedisError, OSError) as error:
                self._lost(error)
            except Exception as error:  # a bug, not an outage: loud, counted, carry on
                self.errors.record("link-report", error)

    async def _collect(self) -> None:
        """The engine's window into `unsent`; an engine away sends none this time."""
        try:
            window = await self.engine.collect()
        except EngineUnreachable as error:
            self._engine_away(error)
            return
        self._engine_back()
        self.unsent.append(window)

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
            except EngineUnreachable as error:  # an outage: retried with the backoff
                self._engine_away(error)
            except Exception as error:  # a bug, not an outage: loud, counted, retried
                self.errors.record("link-config", error)
            await asyncio.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
            attempt += 1

    async def _sync_config(self) -> None:
        published = await self.bus.current_config(self.pool)
        if published is None or published.version <= self.engine.version:
            return
        if self.rejected is not None and published.version <= self.rejected["version"]:
            return  # refused once: wait for a newer one rather than hammer the engine
        try:
            await self.engine.apply(published)
        except ConfigRejected as error:
            self._refused(published, str(error))
            return
        self.rejected = None  # a newer config is in force: the old refusal is history
        self.configs_applied += 1

    def _refused(self, published: VersionedConfig, reason: str) -> None:
        self.rejected = {
            "version": published.version,
            "config": published.config.describe(),
            "reason": reason,
        }
        log.warning(
            "%s %s refused config v%d (%s): %s; config v%d keeps serving",
            self.engine.kind,
            self.name,
            published.version,
            published.config.describe(),
            reason,
            self.engine.version,
        )

    def _lost(self, error: Exception) -> None:
        if self.connected:
            log.warning(
                "redis unreachable (%s); serving with config v%d", error, self.engine.version
            )
        self.connected = False

    def _engine_away(self, error: EngineUnreachable) -> None:
        if self.unreachable is None:
            log.warning(
                "%s %s unreachable (%s): reported not ready; heartbeats go on",
                self.engine.kind,
                self.name,
                error,
            )
        self.unreachable = f"{self.engine.kind} unreachable: {error}"

    def _engine_back(self) -> None:
        if self.unreachable is not None:
            log.info("%s %s answers again", self.engine.kind, self.name)
        self.unreachable = None

    def info(self) -> dict[str, Any]:
        """The heartbeat's payload: what the pool's API shows of this member."""
        status = self.engine.status()
        if self.unreachable is not None:
            status = {**status, "ready": False, "not_ready": self.unreachable}
        return {
            "time": time.time(),
            "engine": self.engine.kind,
            "change_cost": asdict(self.engine.change_cost),
            "config_version": self.engine.version,
            "rejected": self.rejected,
            **status,
        }
