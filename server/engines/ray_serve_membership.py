"""One `@tidal_batch` method's membership of a Tidal pool, inside a Ray Serve replica.

A handle call reaches one replica, so nothing outside a replica can steer all of them;
hence every replica joins the pool itself, as `tidal worker` does: on its first request,
or at construction with `join_pool`, it starts a `PoolMember` (server/engines/member.py)
on its own event loop, next to Ray's batch queue, with a `RayServeEngine` that reports
what the handler served each second and applies the pool's configs through Serve's
setters as they are published (fail-static while Redis is away). `call` and `run_batch`
are the decorated method's body and Ray's batch function: they stamp and count each call.

What Ray tells a replica about itself comes from `serve.get_replica_context()`: its
deployment's name and replica id (public), and its `max_ongoing_requests`, for which Ray
has no public reader (`deployment_max_ongoing_requests`, below).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ray import serve
from redis.exceptions import RedisError

from server.bus.redis_bus import RedisBus, connect
from server.engines.member import PoolMember
from server.engines.protocols import ConfigRejected
from server.engines.ray_serve_counters import BatchTiming, QueuedCall
from server.engines.ray_serve_engine import RayServeEngine, warm_hook
from server.engines.ray_serve_settings import BatchSettings, check_cap
from server.tasks import BackgroundErrors

log = logging.getLogger("tidal.ray_serve")


class MonotonicClock:
    """`time.perf_counter()`, zero at construction. Not the loop's time: Serve runs
    replica code on uvloop, whose `loop.time()` is libuv's millisecond clock, cached once
    per loop iteration: too coarse for queue waits and batches of a few milliseconds."""

    def __init__(self) -> None:
        self._zero = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._zero


def replica_name(name: str | None) -> str:
    """`<name or deployment>-<replica id>`, from Serve's public replica context."""
    context = serve.get_replica_context()
    return f"{name or context.deployment}-{context.replica_tag}"


def deployment_max_ongoing_requests() -> int:
    """The running deployment's `max_ongoing_requests`, read live (a redeploy can change
    it in place). Ray 2.60 has no public reader of it inside a replica: `ReplicaContext`
    exposes the deployment's name and the replica's id, not its config, and
    `Deployment.max_ongoing_requests` lives on the object the class was decorated into,
    which a replica never sees. Serve's own batching (`ray/serve/batching.py`) reads it
    here, as this does; this is Tidal's only use of a private Ray attribute."""
    return serve.get_replica_context()._deployment_config.max_ongoing_requests


class Membership:
    """One decorated method's pool membership in this replica (Ray's batch queue is per
    method and per process, and so is this): joined once, on the replica's loop."""

    def __init__(self, settings: BatchSettings) -> None:
        self.settings = settings
        self.batched: Any = None  # Ray's batch wrapper: the knobs
        self._reset()

    def _reset(self) -> None:
        self.clock = MonotonicClock()
        self.errors = BackgroundErrors()
        self.engine: RayServeEngine | None = None
        self.member: PoolMember | None = None
        self._bus: RedisBus | None = None

    # Ray pickles the deployment class, and this with it, before any replica runs (when
    # the class is not importable there): only what was declared travels, never a
    # loop, task or client.
    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "batched": self.batched}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def join(self, instance: Any) -> None:
        """Join the pool (once), on the running loop: report, follow the pool's config,
        warm the initial cap's buckets (the cap serves once they are warm)."""
        if self.engine is not None:
            return
        declared = self.settings
        pool = declared.member.resolved(os.environ)
        engine = RayServeEngine(
            self.batched,
            replica_name(declared.name),
            declared.initial,
            declared.max_concurrent_batches,
            self._max_ongoing_requests,
            warm_hook(declared.warmup, instance),
            self.clock,
            self.errors,
            pool.interval_s,
        )
        self._warn_if_initial_cap_does_not_fit(engine)
        self._bus = RedisBus(connect(pool.redis_url), prefix=pool.redis_prefix)
        self.member = PoolMember(
            engine,
            self._bus,
            pool.pool,
            engine.worker,
            self.clock,
            self.errors,
            interval_s=pool.interval_s,
            heartbeat_ttl_s=pool.heartbeat_ttl_s,
        )
        engine.begin()
        self.member.start()
        self.engine = engine
        log.info("%s joined pool %s (prefix %s)", engine.worker, pool.pool, pool.redis_prefix)

    def _warn_if_initial_cap_does_not_fit(self, engine: RayServeEngine) -> None:
        """The starting config is the code's, not the pool's: serve it as Ray does, but
        say so (a published config that does not fit is refused)."""
        declared = self.settings
        try:
            check_cap(
                declared.initial.max_batch_size, declared.max_concurrent_batches, engine.limit
            )
        except ConfigRejected as error:
            log.warning("%s: the starting config does not fit: %s", engine.worker, error)

    def _max_ongoing_requests(self) -> int:
        fixed = self.settings.max_ongoing_requests
        return deployment_max_ongoing_requests() if fixed is None else fixed

    async def leave(self) -> None:
        """Send the last window, stop the member's loops and any warm-up, close the client."""
        if self.member is not None:
            await self.member.stop()
        if self.engine is not None:
            await self.engine.close()
        if self._bus is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._bus.client.aclose()
        self._reset()

    async def call(self, instance: Any, payload: Any) -> tuple[Any, BatchTiming]:
        """The decorated method's body: one call through Ray's batch queue, counted."""
        if self.engine is None:
            self.join(instance)
        engine = self.engine
        assert engine is not None
        call = QueuedCall(instance, payload, self.clock.now())
        engine.counters.arrived()
        try:
            result = await self.batched(call)
        finally:
            if not call.started:
                engine.counters.left_unserved()
        assert call.timing is not None
        return result, call.timing

    async def run_batch(
        self, func: Callable[..., Awaitable[list]], calls: list[QueuedCall]
    ) -> list:
        """Ray's batch function: time the user's handler, count what it served."""
        engine = self.engine
        assert engine is not None
        started = self.clock.now()
        engine.counters.started(calls, started)
        cap, version = engine.serving_cap, engine.version
        ok = False
        try:
            results = await func(calls[0].instance, [c.payload for c in calls])
            ok = True
        finally:
            done = self.clock.now()
            engine.counters.finished(calls, started, done, ok)
        for c in calls:
            c.timing = BatchTiming(started - c.called_at, done - started, len(calls), cap, version)
        return results
