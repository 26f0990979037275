"""`LocalPoolBus`: the live bus inside one process (`tidal controller --redis none`,
`tidal demo`, tests), with the semantics of `server.bus.redis_bus.RedisBus`: a config is
kept only if newer, heartbeats expire, streams are capped (`server.bus.protocols`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.clock import Clock
from server.clock import LoopClock


class _LocalNotices:
    def __init__(self, subscribers: set[asyncio.Queue]) -> None:
        self._subscribers = subscribers
        self._queue: asyncio.Queue[int] = asyncio.Queue()
        subscribers.add(self._queue)

    async def listen(self) -> AsyncIterator[int]:
        while True:
            yield await self._queue.get()

    async def aclose(self) -> None:
        self._subscribers.discard(self._queue)


class _Pool:
    def __init__(self, stats_maxlen: int, decisions_maxlen: int) -> None:
        self.config: VersionedConfig | None = None
        self.subscribers: set[asyncio.Queue] = set()
        self.stats: deque[tuple[int, WorkerStats]] = deque(maxlen=stats_maxlen)
        self.arrivals: dict[int, int] = {}
        self.heartbeats: dict[str, tuple[float, dict[str, Any]]] = {}
        self.decisions: deque[dict[str, Any]] = deque(maxlen=decisions_maxlen)
        self.lease: tuple[str, float] | None = None
        self.settings: dict[str, Any] = {}
        self.desired_replicas: int | None = None


class LocalPoolBus:
    """`PoolBus` inside one process and one event loop; nothing survives the process."""

    def __init__(
        self,
        stats_maxlen: int = 100_000,
        decisions_maxlen: int = 100_000,
        history_s: int = 8 * 86_400,
        clock: Clock | None = None,
    ) -> None:
        self.history_s = history_s
        # Heartbeats and leases expire on the event loop's clock: virtual time in tests.
        self._clock = clock or LoopClock()
        self._maxlen = (stats_maxlen, decisions_maxlen)
        self._pools: dict[str, _Pool] = {}
        self._ids = itertools.count(1)

    def _pool(self, pool: str) -> _Pool:
        if pool not in self._pools:
            self._pools[pool] = _Pool(*self._maxlen)
        return self._pools[pool]

    async def publish_config(self, pool: str, config: VersionedConfig) -> bool:
        p = self._pool(pool)
        if p.config is not None and config.version <= p.config.version:
            return False
        p.config = config
        for queue in p.subscribers:
            queue.put_nowait(config.version)
        return True

    async def current_config(self, pool: str) -> VersionedConfig | None:
        return self._pool(pool).config

    async def subscribe_configs(self, pool: str) -> _LocalNotices:
        return _LocalNotices(self._pool(pool).subscribers)

    async def publish_worker_stats(
        self, pool: str, stats: WorkerStats, at_s: float | None = None
    ) -> None:
        p = self._pool(pool)
        p.stats.append((next(self._ids), stats))
        second = int(at_s if at_s is not None else time.time())
        p.arrivals[second] = p.arrivals.get(second, 0) + stats.arrivals

    async def read_worker_stats(
        self, pool: str, after: str = "0-0"
    ) -> tuple[list[WorkerStats], str, int]:
        seen = int(after.split("-")[0])
        fresh = [(i, s) for i, s in self._pool(pool).stats if i > seen]
        return [s for _, s in fresh], (f"{fresh[-1][0]}-0" if fresh else after), 0

    async def last_stats_id(self, pool: str) -> str:
        stats = self._pool(pool).stats
        return f"{stats[-1][0]}-0" if stats else "0-0"

    async def arrivals_per_second(self, pool: str, since_s: int, until_s: int) -> dict[int, int]:
        return {s: n for s, n in self._pool(pool).arrivals.items() if since_s <= s < until_s}

    async def trim_history(self, pool: str, now_s: int) -> int:
        arrivals = self._pool(pool).arrivals
        old = [s for s in arrivals if s < now_s - self.history_s]
        for second in old:
            del arrivals[second]
        return len(old)

    async def heartbeat(self, pool: str, worker: str, info: dict[str, Any], ttl_s: float) -> None:
        self._pool(pool).heartbeats[worker] = (self._clock.now() + ttl_s, info)

    async def leave(self, pool: str, worker: str) -> None:
        self._pool(pool).heartbeats.pop(worker, None)

    async def workers_alive(self, pool: str) -> dict[str, dict[str, Any]]:
        now = self._clock.now()
        beats = self._pool(pool).heartbeats
        for worker in [w for w, (expires, _) in beats.items() if expires <= now]:
            del beats[worker]
        return {worker: info for worker, (_, info) in beats.items()}

    async def publish_desired_replicas(self, pool: str, replicas: int) -> None:
        self._pool(pool).desired_replicas = replicas

    async def desired_replicas(self, pool: str) -> int | None:
        return self._pool(pool).desired_replicas

    async def record_decision(self, pool: str, record: dict[str, Any]) -> str:
        self._pool(pool).decisions.append(record)
        return f"{next(self._ids)}-0"

    async def decisions(self, pool: str, count: int = 100) -> list[dict[str, Any]]:
        return list(self._pool(pool).decisions)[-count:] if count > 0 else []

    async def acquire_or_renew_lease(self, pool: str, holder: str, ttl_s: float) -> bool:
        p, now = self._pool(pool), self._clock.now()
        if p.lease is None or p.lease[1] <= now or p.lease[0] == holder:
            p.lease = (holder, now + ttl_s)
            return True
        return False

    async def leader(self, pool: str) -> str | None:
        lease = self._pool(pool).lease
        return lease[0] if lease is not None and lease[1] > self._clock.now() else None

    async def save_setting(self, pool: str, name: str, value: Any) -> None:
        settings = self._pool(pool).settings
        if value is None:
            settings.pop(name, None)
        else:
            settings[name] = value

    async def load_settings(self, pool: str) -> dict[str, Any]:
        return dict(self._pool(pool).settings)
