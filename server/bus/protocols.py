"""What each role needs of the live bus, as small protocols.

A worker publishes its stats and heartbeat and follows the pool's config
(`WorkerBus`); a controller reads the pool's stats and liveness and publishes configs
(`ControllerBus`), keeps the pool's traffic and decision history (`PoolHistory`),
follows the operators' settings (`SettingsStore`) and takes part in leader election
(`LeaderLease`). `PoolBus` is all five, which is what `LocalPoolBus` (one process) and
`RedisBus` (across machines) implement, with the same semantics: a config is stored only
if its version is newer, heartbeats expire, streams are capped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from adaptive.bus import VersionedConfig, WorkerStats


class ConfigNotices(Protocol):
    """A subscription to one pool's config changes (a Redis pub/sub handle)."""

    def listen(self) -> AsyncIterator[Any]:
        """Yields once per config change (the message is only a nudge: re-read the config)."""
        ...

    async def aclose(self) -> None:
        """Unsubscribe: `listen` yields nothing more. With the bus gone it may raise, as any
        call may."""
        ...


class WorkerBus(Protocol):
    """A worker's side: configs in, stats and heartbeats out."""

    async def current_config(self, pool: str) -> VersionedConfig | None:
        """The pool's stored config, or None before any controller published one."""
        ...

    async def subscribe_configs(self, pool: str) -> ConfigNotices:
        """Notices of config changes; subscribe first, then read, so no change slips by."""
        ...

    async def publish_worker_stats(
        self, pool: str, stats: WorkerStats, at_s: float | None = None
    ) -> None:
        """Append one window's stats and count its arrivals at Unix second `at_s` (now)."""
        ...

    async def heartbeat(self, pool: str, worker: str, info: dict[str, Any], ttl_s: float) -> None:
        """The worker is alive for `ttl_s` more seconds; `info` is what the API shows."""
        ...

    async def leave(self, pool: str, worker: str) -> None:
        """The worker is gone from the pool now (a drain began), not when its beat expires."""
        ...


class ControllerBus(Protocol):
    """A controller's side of the pool: stats and liveness in, configs out."""

    async def publish_config(self, pool: str, config: VersionedConfig) -> bool:
        """Store and announce `config`; False, and nothing stored, unless it is newer."""
        ...

    async def current_config(self, pool: str) -> VersionedConfig | None:
        """The pool's stored config, or None before any was published."""
        ...

    async def read_worker_stats(
        self, pool: str, after: str = "0-0"
    ) -> tuple[list[WorkerStats], str, int]:
        """Stats entries after stream id `after`: those that parse, the id to read after
        next time (past every entry read, parsed or not), and how many did not parse."""
        ...

    async def last_stats_id(self, pool: str) -> str:
        """The newest entry's id ("0-0" if none): read after it for news only."""
        ...

    async def workers_alive(self, pool: str) -> dict[str, dict[str, Any]]:
        """Each worker whose heartbeat has not expired, with its last `info`."""
        ...

    async def publish_desired_replicas(self, pool: str, replicas: int) -> None:
        """Store how many replicas the pool should have (a fleet that scales), for the
        engine's autoscaler to act on; it holds until the next publish."""
        ...

    async def desired_replicas(self, pool: str) -> int | None:
        """The stored desired replica count; None before any was published."""
        ...


class PoolHistory(Protocol):
    """What outlives a controller: per-second traffic and the decision log."""

    async def arrivals_per_second(self, pool: str, since_s: int, until_s: int) -> dict[int, int]:
        """Recorded arrivals per Unix second in [since_s, until_s); seconds with none absent."""
        ...

    async def trim_history(self, pool: str, now_s: int) -> int:
        """Drop traffic history past the retention; returns how many seconds were dropped."""
        ...

    async def record_decision(self, pool: str, record: dict[str, Any]) -> str:
        """Append one decision record (JSON-able, as `DecisionRecord.to_dict` gives it) to the
        pool's capped log; returns its entry id."""
        ...

    async def decisions(self, pool: str, count: int = 100) -> list[dict[str, Any]]:
        """The newest `count` decision records, oldest first."""
        ...


class SettingsStore(Protocol):
    """Operator settings (policy, override, events) that every controller follows."""

    async def save_setting(self, pool: str, name: str, value: Any) -> None:
        """Persist a JSON-able setting; None deletes it."""
        ...

    async def load_settings(self, pool: str) -> dict[str, Any]:
        """Every stored setting by name (a copy), as saved; {} when none is."""
        ...


class LeaderLease(Protocol):
    """One leader per pool, by an expiring lease."""

    async def acquire_or_renew_lease(self, pool: str, holder: str, ttl_s: float) -> bool:
        """True while `holder` leads: takes a free or expired lease, or renews its own."""
        ...

    async def leader(self, pool: str) -> str | None:
        """Who holds the pool's lease now; None when it is free or expired."""
        ...


class PoolBus(WorkerBus, ControllerBus, PoolHistory, SettingsStore, LeaderLease, Protocol):
    """Every role's needs: what a bus implementation offers.

    A call that cannot reach the bus raises `redis.exceptions.RedisError` or `OSError`;
    the shells take either as the bus being away (a member serves on with its last
    config, the control loop retries, the API answers 503), anything else as a bug."""
