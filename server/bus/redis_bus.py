"""The Redis bus: configs, worker stats, liveness, traffic history and leadership.

Keys live under a prefix (`tidal` by default), per pool:

    {prefix}:{pool}:config          hash: version, max_batch, timeout_s, warm_max_batch
    {prefix}:{pool}:config:notify   pub/sub channel: the new version, after each change
    {prefix}:{pool}:stats           stream (capped): one entry per WorkerStats, JSON
    {prefix}:{pool}:arrivals:{hour} hash per Unix hour: second -> arrivals (expires after
                                    `history_s`, so history never needs a scan to trim)
    {prefix}:{pool}:worker:{id}     heartbeat, with a TTL: a worker that stops beating leaves
    {prefix}:{pool}:workers         sorted set: worker -> last beat's expiry (an index, so
                                    listing a pool never scans the keyspace)
    {prefix}:{pool}:decisions       stream (capped): the controller's decision records
    {prefix}:{pool}:leader          the controller lease (SET NX PX, renewed)
    {prefix}:{pool}:settings        hash: operator settings (policy, override, events), JSON
    {prefix}:{pool}:replicas        JSON: the replica count the pool should have (a fleet
                                    that scales), when it was set, by which controller

A config is written with its version by a script that refuses anything not newer, so
versions never go backwards whoever writes; workers apply only newer versions and read
the hash when they (re)connect, so a missed notification is never a missed config.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis.asyncio as redis

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.config import BatchConfig
from server.bus.wire import MalformedStats, decode_stats, encode_stats

log = logging.getLogger("tidal.bus")

_SET_IF_NEWER = """
local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if tonumber(ARGV[1]) <= current then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[1], 'max_batch', ARGV[2], 'timeout_s', ARGV[3],
           'warm_max_batch', ARGV[4])
redis.call('PUBLISH', KEYS[2], ARGV[1])
return 1
"""

_RENEW_IF_HELD = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def pool_key(prefix: str, pool: str, *parts: str) -> str:
    """A pool's key: what `RedisBus` and an engine's own reader (Ray Serve's autoscaling
    policy reads the desired replicas with a synchronous client) both address."""
    return ":".join((prefix, pool, *parts))


def parse_desired_replicas(text: str | None) -> int | None:
    """The count in a stored `replicas` value; None when absent or not a count >= 0."""
    if text is None:
        return None
    try:
        replicas = json.loads(text)["replicas"]
    except (ValueError, KeyError, TypeError):
        return None
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        return None
    return replicas


def connect(url: str) -> redis.Redis:
    """A client for `redis://[user:password@]host:port/db` or `rediss://` (TLS)."""
    return redis.Redis.from_url(url, decode_responses=True, health_check_interval=10)


class RedisBus:
    """`server.bus.local.PoolBus` on Redis; one per process, shared by its tasks."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "tidal",
        stats_maxlen: int = 100_000,
        decisions_maxlen: int = 100_000,
        history_s: int = 8 * 86_400,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.stats_maxlen = stats_maxlen
        self.decisions_maxlen = decisions_maxlen
        self.history_s = history_s
        self._set_if_newer = client.register_script(_SET_IF_NEWER)
        self._renew_if_held = client.register_script(_RENEW_IF_HELD)

    def key(self, pool: str, *parts: str) -> str:
        return pool_key(self.prefix, pool, *parts)

    # -- configs ---------------------------------------------------------------------

    async def publish_config(self, pool: str, config: VersionedConfig) -> bool:
        """Write and announce `config`; False (and nothing written) unless it is newer."""
        c = config.config
        written = await self._set_if_newer(
            keys=[self.key(pool, "config"), self.key(pool, "config", "notify")],
            args=[config.version, c.max_batch_size, repr(c.timeout_s), c.warm_max_batch],
        )
        return bool(written)

    async def current_config(self, pool: str) -> VersionedConfig | None:
        fields = await self.client.hgetall(self.key(pool, "config"))
        if not fields:
            return None
        config = BatchConfig(
            int(fields["max_batch"]), float(fields["timeout_s"]), int(fields["warm_max_batch"])
        )
        return VersionedConfig(int(fields["version"]), config)

    async def subscribe_configs(self, pool: str) -> redis.client.PubSub:
        """A pub/sub handle on the pool's config channel; each message is a new version."""
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        await pubsub.subscribe(self.key(pool, "config", "notify"))
        return pubsub

    # -- worker stats, liveness and traffic history ------------------------------------

    async def publish_worker_stats(
        self, pool: str, stats: WorkerStats, at_s: float | None = None
    ) -> None:
        """Append to the pool's stats stream and add the arrivals to its per-second counts."""
        second = int(at_s if at_s is not None else time.time())
        hour = self.arrivals_key(pool, second // 3600)
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.xadd(
                self.key(pool, "stats"),
                {"stats": encode_stats(stats)},
                maxlen=self.stats_maxlen,
                approximate=True,
            )
            pipe.hincrby(hour, str(second), stats.arrivals)
            pipe.expire(hour, self.history_s + 3600)
            await pipe.execute()

    def arrivals_key(self, pool: str, hour: int) -> str:
        return self.key(pool, "arrivals", str(hour))

    async def read_worker_stats(
        self, pool: str, after: str = "0-0"
    ) -> tuple[list[WorkerStats], str]:
        """Stats entries after stream id `after` that parse, the id to read after next
        time, and how many entries were skipped as malformed."""
        entries = await self.client.xread({self.key(pool, "stats"): after}, count=10_000)
        stats, last, malformed = [], after, 0
        for _stream, items in entries:
            for entry_id, fields in items:
                last = entry_id  # past it whatever it holds: a bad entry is read once
                try:
                    stats.append(decode_stats(fields.get("stats")))
                except MalformedStats as error:
                    malformed += 1
                    log.warning("%s: skipping stats entry %s: %s", pool, entry_id, error)
        return stats, last, malformed

    async def last_stats_id(self, pool: str) -> str:
        """The id of the newest stats entry ("0-0" if none): read after it for news only."""
        newest = await self.client.xrevrange(self.key(pool, "stats"), count=1)
        return newest[0][0] if newest else "0-0"

    async def arrivals_per_second(self, pool: str, since_s: int, until_s: int) -> dict[int, int]:
        """Recorded arrivals per Unix second in [since_s, until_s): one read per hour."""
        hours = range(since_s // 3600, (until_s - 1) // 3600 + 1)
        async with self.client.pipeline(transaction=False) as pipe:
            for hour in hours:
                pipe.hgetall(self.arrivals_key(pool, hour))
            buckets = await pipe.execute()
        return {
            int(s): int(n)
            for bucket in buckets
            for s, n in bucket.items()
            if since_s <= int(s) < until_s
        }

    async def trim_history(self, pool: str, now_s: int) -> int:
        """Nothing to do: each hour's counts expire on their own after `history_s`."""
        return 0

    async def heartbeat(self, pool: str, worker: str, info: dict[str, Any], ttl_s: float) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(self.key(pool, "worker", worker), json.dumps(info), px=int(ttl_s * 1e3))
            pipe.zadd(self.key(pool, "workers"), {worker: time.time() + ttl_s})
            await pipe.execute()

    async def leave(self, pool: str, worker: str) -> None:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.delete(self.key(pool, "worker", worker))
            pipe.zrem(self.key(pool, "workers"), worker)
            await pipe.execute()

    async def workers_alive(self, pool: str) -> dict[str, dict[str, Any]]:
        """Workers whose heartbeat key lives (Redis' own TTL decides); the index drops
        members a minute past their expiry, which tolerates clock skew between hosts."""
        index = self.key(pool, "workers")
        await self.client.zremrangebyscore(index, "-inf", time.time() - 60)
        names = await self.client.zrange(index, 0, -1)
        if not names:
            return {}
        values = await self.client.mget([self.key(pool, "worker", n) for n in names])
        return {n: json.loads(v) for n, v in zip(names, values, strict=True) if v is not None}

    # -- decisions and leadership ------------------------------------------------------

    async def publish_desired_replicas(self, pool: str, replicas: int) -> None:
        value = {"replicas": int(replicas), "at": time.time()}
        await self.client.set(self.key(pool, "replicas"), json.dumps(value))

    async def desired_replicas(self, pool: str) -> int | None:
        return parse_desired_replicas(await self.client.get(self.key(pool, "replicas")))

    async def record_decision(self, pool: str, record: dict[str, Any]) -> str:
        return await self.client.xadd(
            self.key(pool, "decisions"),
            {"record": json.dumps(record)},
            maxlen=self.decisions_maxlen,
            approximate=True,
        )

    async def decisions(self, pool: str, count: int = 100) -> list[dict[str, Any]]:
        """The newest `count` decision records, oldest first."""
        entries = await self.client.xrevrange(self.key(pool, "decisions"), count=count)
        return [json.loads(fields["record"]) for _id, fields in reversed(entries)]

    async def acquire_or_renew_lease(self, pool: str, holder: str, ttl_s: float) -> bool:
        """True while `holder` leads the pool: takes a free lease or renews its own."""
        key = self.key(pool, "leader")
        ttl_ms = int(ttl_s * 1e3)
        if await self.client.set(key, holder, nx=True, px=ttl_ms):
            return True
        return bool(await self._renew_if_held(keys=[key], args=[holder, ttl_ms]))

    async def leader(self, pool: str) -> str | None:
        return await self.client.get(self.key(pool, "leader"))

    # -- operator settings (they outlive any controller process) -------------------------

    async def save_setting(self, pool: str, name: str, value: Any) -> None:
        """Persist an operator setting (JSON-able); None deletes it."""
        key = self.key(pool, "settings")
        if value is None:
            await self.client.hdel(key, name)
        else:
            await self.client.hset(key, name, json.dumps(value))

    async def load_settings(self, pool: str) -> dict[str, Any]:
        fields = await self.client.hgetall(self.key(pool, "settings"))
        return {name: json.loads(value) for name, value in fields.items()}
