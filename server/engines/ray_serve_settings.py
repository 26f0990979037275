"""What `@tidal_batch` is configured with, checked when the deployment class is defined.

The decorator's arguments are one value, `BatchSettings`: the starting config, Ray's
`max_concurrent_batches`, the bound caps are checked against, the warm-up hook, the
member's name and the pool to join. The pool (`MemberSettings`) comes from the decorator
(`pool`, `redis_url`, `redis_prefix`), else the replica's environment (TIDAL_POOL,
TIDAL_REDIS_URL, TIDAL_REDIS_PREFIX), read when the replica joins rather than at import,
so one class serves any pool.

The cap rule lives here too: Ray admits at most `max_ongoing_requests` requests to a
replica, so `max_batch_size * max_concurrent_batches` above it could never fill; such a
cap is refused (`ConfigRejected`, naming both numbers), never clamped.

No Ray here: these are values, and `server.engines.ray_serve_replicas` reads
`MemberSettings` to find the pool too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adaptive.config import BatchConfig
from server.engines.protocols import ConfigRejected
from tidal_base.errors import InvalidInput

POOL_ENV = "TIDAL_POOL"
REDIS_URL_ENV = "TIDAL_REDIS_URL"
REDIS_PREFIX_ENV = "TIDAL_REDIS_PREFIX"


@dataclass(frozen=True, slots=True)
class MemberSettings:
    """The pool a replica joins; None: read from the replica's environment at join."""

    pool: str | None = None
    redis_url: str | None = None
    redis_prefix: str | None = None
    interval_s: float = 1.0
    heartbeat_ttl_s: float = 3.0

    def resolved(self, environ: Mapping[str, str]) -> MemberSettings:
        """Every field filled, from code first, then the environment; a missing pool or
        URL is a one-line error naming both ways to give it."""
        pool = self.pool or environ.get(POOL_ENV)
        url = self.redis_url or environ.get(REDIS_URL_ENV)
        prefix = self.redis_prefix or environ.get(REDIS_PREFIX_ENV) or "tidal"
        if not pool:
            raise InvalidInput(f"tidal_batch: no pool: pass pool=... or set ${POOL_ENV}")
        if not url:
            raise InvalidInput(f"tidal_batch: no Redis: pass redis_url=... or set ${REDIS_URL_ENV}")
        if self.interval_s <= 0 or self.heartbeat_ttl_s <= self.interval_s:
            raise InvalidInput("tidal_batch: need 0 < interval_s < heartbeat_ttl_s")
        return MemberSettings(pool, url, prefix, self.interval_s, self.heartbeat_ttl_s)


def check_cap(max_batch_size: int, max_concurrent_batches: int, max_ongoing_requests: int) -> None:
    """Refuse a cap the replica can never fill: Ray admits `max_ongoing_requests` at a
    time, and `max_concurrent_batches` batches of the cap would need more."""
    needed = max_batch_size * max_concurrent_batches
    if needed > max_ongoing_requests:
        raise ConfigRejected(
            f"max_batch={max_batch_size} x max_concurrent_batches={max_concurrent_batches}"
            f" = {needed} exceeds the deployment's max_ongoing_requests={max_ongoing_requests}"
            f" (the largest cap it takes is {max_ongoing_requests // max_concurrent_batches})"
        )


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """One `@tidal_batch`'s arguments, validated.

    initial: the starting config (`max_batch_size`, `batch_wait_timeout_s`).
    max_concurrent_batches: Ray's, fixed for the replica's life.
    max_ongoing_requests: the bound caps must fit under; None: the deployment's, read
        live in the replica.
    warmup: a method `(self, bucket)`, async or sync, or None (warm-up not modelled).
    member: the pool to join.
    name: the member's name before the replica id; None: the deployment's name.
    """

    initial: BatchConfig
    max_concurrent_batches: int = 1
    max_ongoing_requests: int | None = None
    warmup: Callable[..., Any] | None = None
    member: MemberSettings = field(default_factory=MemberSettings)
    name: str | None = None

    def __post_init__(self) -> None:
        concurrent = self.max_concurrent_batches
        if isinstance(concurrent, bool) or not isinstance(concurrent, int):
            raise InvalidInput(f"max_concurrent_batches must be an integer, got {concurrent!r}")
        if concurrent < 1:
            raise InvalidInput(f"max_concurrent_batches must be >= 1, got {concurrent}")
        if self.max_ongoing_requests is not None:
            try:
                check_cap(self.initial.max_batch_size, concurrent, self.max_ongoing_requests)
            except ConfigRejected as error:
                raise InvalidInput(f"tidal_batch: {error}") from None
