"""Ray Serve replicas as members of a Tidal pool: `@tidal_batch` around `@serve.batch`.

Ray Serve batches a deployment's requests with `@serve.batch`, and each replica can
change its batch cap and timeout in place with the public setters on the decorated
method (`set_max_batch_size`, `set_batch_wait_timeout_s`: attributes of the method, so
they act on the replica's own batch queue, from the next batch it forms). `tidal_batch`
wraps the batch handler so that each replica joins the pool itself, reports what its
handler served each second and applies the pool's configs through those setters as they
are published (fail-static while Redis is away). See docs/ray_serve.md.

This is the import path users and examples use; the parts live beside it, one concern
each:

    ray_serve_settings.py    what the decorator is configured with: `BatchSettings`,
                             the pool (`MemberSettings`, code or environment), the cap
                             rule (`check_cap`); no Ray
    ray_serve_counters.py    what the handler counts: `BatchCounters`, `QueuedCall`,
                             `BatchTiming`; no Ray
    ray_serve_engine.py      `RayServeEngine`: a config through the setters, warm-ups
                             (a cancelled one joined), change cost, stats; no Ray
    ray_serve_membership.py  `Membership`: the replica's member joined, left, and the
                             decorated method's body; Ray's replica context
    ray_serve.py             the decorator and its helpers (here), re-exporting the rest
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ray import serve

from adaptive.config import BatchConfig
from server.engines.ray_serve_counters import BatchCounters, BatchTiming, QueuedCall
from server.engines.ray_serve_engine import KIND, BatchKnobs, RayServeEngine, WarmHook
from server.engines.ray_serve_membership import Membership, MonotonicClock
from server.engines.ray_serve_settings import (
    POOL_ENV,
    REDIS_PREFIX_ENV,
    REDIS_URL_ENV,
    BatchSettings,
    MemberSettings,
    check_cap,
)
from tidal_base.errors import InvalidInput

__all__ = [
    "KIND",
    "POOL_ENV",
    "REDIS_PREFIX_ENV",
    "REDIS_URL_ENV",
    "BatchCounters",
    "BatchKnobs",
    "BatchSettings",
    "BatchTiming",
    "MemberSettings",
    "Membership",
    "MonotonicClock",
    "QueuedCall",
    "RayServeEngine",
    "WarmHook",
    "check_cap",
    "join_pool",
    "leave_pool",
    "membership",
    "tidal_batch",
    "timed_call",
]


def tidal_batch(
    _func: Callable | None = None,
    /,
    *,
    max_batch_size: int = 10,
    batch_wait_timeout_s: float = 0.01,
    max_concurrent_batches: int = 1,
    warmup: Callable[..., Any] | None = None,
    pool: str | None = None,
    redis_url: str | None = None,
    redis_prefix: str | None = None,
    max_ongoing_requests: int | None = None,
    name: str | None = None,
    interval_s: float = 1.0,
    heartbeat_ttl_s: float = 3.0,
) -> Callable:
    """`@serve.batch` whose replica is a member of a Tidal pool.

    Decorate an `async def handler(self, items: list) -> list` method of a deployment, as
    with `@serve.batch`; the first three arguments are its starting config. `warmup`,
    a method `(self, bucket)` (async, or sync: run in a thread), prepares one batch
    size before a cap that needs it serves. `pool`, `redis_url`, `redis_prefix`: the
    pool to join (else $TIDAL_POOL, $TIDAL_REDIS_URL, $TIDAL_REDIS_PREFIX, default
    prefix "tidal"). `max_ongoing_requests`: the bound caps are checked against (default:
    the deployment's, read live). `name`: the member's name before the replica id
    (default: the deployment's name). The decorated method keeps Ray's setters.
    """
    settings = BatchSettings(
        BatchConfig(max_batch_size, batch_wait_timeout_s),
        max_concurrent_batches,
        max_ongoing_requests,
        warmup,
        MemberSettings(pool, redis_url, redis_prefix, interval_s, heartbeat_ttl_s),
        name,
    )

    def decorate(func: Callable) -> Callable:
        return _batched_method(func, settings)

    return decorate(_func) if _func is not None else decorate


def _batched_method(func: Callable, settings: BatchSettings) -> Callable:
    """`func` behind Ray's batch queue, through a `Membership` that counts each call."""
    if not inspect.iscoroutinefunction(func):
        raise InvalidInput(f"tidal_batch: {func.__qualname__} must be an async def")
    joined = Membership(settings)

    async def run_batch(calls: list[QueuedCall]) -> list:
        return await joined.run_batch(func, calls)

    run_batch.__name__ = run_batch.__qualname__ = func.__name__  # Ray's metrics tag
    initial = settings.initial
    batched = serve.batch(
        max_batch_size=initial.max_batch_size,
        batch_wait_timeout_s=initial.timeout_s,
        max_concurrent_batches=settings.max_concurrent_batches,
    )(run_batch)
    joined.batched = batched

    @functools.wraps(func)
    async def method(self: Any, item: Any) -> Any:
        return (await joined.call(self, item))[0]

    method.__tidal__ = joined  # type: ignore[attr-defined]
    method.set_max_batch_size = batched.set_max_batch_size  # type: ignore[attr-defined]
    method.set_batch_wait_timeout_s = batched.set_batch_wait_timeout_s  # type: ignore[attr-defined]
    return method


def membership(method: Any) -> Membership:
    """The membership behind a `@tidal_batch` method (bound, `self.predict`, or not)."""
    found = getattr(getattr(method, "__func__", method), "__tidal__", None)
    if not isinstance(found, Membership):
        raise InvalidInput(f"{method!r} is not a @tidal_batch method")
    return found


async def timed_call(method: Any, item: Any) -> tuple[Any, BatchTiming]:
    """Call a bound `@tidal_batch` method; returns its result and how it was served."""
    return await membership(method).call(method.__self__, item)


def join_pool(method: Any) -> None:
    """Join the pool now rather than on the first request: call it in the deployment's
    constructor (Ray runs a constructor on the replica's loop), so the replica is in the
    pool and warming before its first request."""
    membership(method).join(method.__self__)


async def leave_pool(method: Any) -> None:
    """Leave the pool cleanly (the last window sent, any warm-up ended): await it in
    `async def __del__`."""
    await membership(method).leave()
