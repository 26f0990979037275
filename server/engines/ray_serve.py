"""Ray Serve replicas as members of a Tidal pool: `@tidal_batch` around `@serve.batch`.

Ray Serve batches a deployment's requests with `@serve.batch`, and each replica can
change its batch cap and timeout in place with the public setters on the decorated
method (`set_max_batch_size`, `set_batch_wait_timeout_s`: attributes of the method, so
they act on the replica's own batch queue, from the next batch it forms). A handle call
reaches one replica, so nothing outside a replica can steer all of them; hence every
replica joins the pool itself, as `tidal worker` does: `tidal_batch` wraps the batch
handler so that the replica runs a `PoolMember` (server/engines/member.py) on its own
event loop, reporting what its handler served each second and applying the pool's
configs through those setters as they are published (fail-static while Redis is away).

What is counted, in the handler itself (Ray's export-port histograms rebuild `_sum` from
bucket midpoints, so their means are not exact): arrivals (calls), completions, exact
batch sizes, each request's queue wait (from its call to its batch starting), each
batch's execution time (`busy_s`), latency (queue wait + execution) as a histogram, and
the queue depth (called, not yet in a batch that started).

A cap must fit under the deployment's `max_ongoing_requests`: Ray admits at most that
many requests to a replica, so `max_batch_size * max_concurrent_batches` above it could
never fill. Such a config is refused (`ConfigRejected`, naming both numbers, never
clamped); the member shows it in its heartbeat and the old config keeps serving.

With a warm-up hook (for models that prepare per batch size: compiled shapes, CUDA
graphs), raising the cap warms the missing power-of-two buckets first, one after another,
while the old cap serves (`adaptive.warmup.WarmupTracker`, the worker's state machine,
fed the measured warm-ups); without one, warm-up is not modelled (`warmed_buckets` None).

Where the pool is: the decorator's `pool`, `redis_url` and `redis_prefix`, else the
replica's environment (TIDAL_POOL, TIDAL_REDIS_URL, TIDAL_REDIS_PREFIX), read when the
replica joins: on its first request, or at construction with `join_pool(self.method)`.
This is the only module of the package that imports ray. See docs/ray_serve.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from ray import serve
from redis.exceptions import RedisError

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.change_cost import ChangeCost
from adaptive.clock import Clock
from adaptive.config import BatchConfig
from adaptive.histogram import LatencyHistogram
from adaptive.warmup import WarmupStatus, WarmupTracker
from server.bus.redis_bus import RedisBus, connect
from server.engines.member import PoolMember
from server.engines.protocols import ConfigRejected
from server.tasks import BackgroundErrors, cancel_and_wait, spawn
from tidal_base.errors import InvalidInput

log = logging.getLogger("tidal.ray_serve")

KIND = "ray-serve"
POOL_ENV = "TIDAL_POOL"
REDIS_URL_ENV = "TIDAL_REDIS_URL"
REDIS_PREFIX_ENV = "TIDAL_REDIS_PREFIX"


# -- where the pool is ---------------------------------------------------------------


class MonotonicClock:
    """`time.perf_counter()`, zero at construction. Not the loop's time: Serve runs
    replica code on uvloop, whose `loop.time()` is libuv's millisecond clock, cached once
    per loop iteration: too coarse for queue waits and batches of a few milliseconds."""

    def __init__(self) -> None:
        self._zero = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._zero


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


# -- what the handler counts ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """How one request was served: what `timed_call` returns beside the result."""

    queue_wait_s: float
    execution_s: float
    batch_size: int
    max_batch_size: int  # the cap in force when its batch started
    config_version: int


class QueuedCall:
    """One call on its way through Ray's batch queue (the same object reaches the batch
    handler, so its stamps travel with it)."""

    __slots__ = ("called_at", "instance", "payload", "started", "timing")

    def __init__(self, instance: Any, payload: Any, called_at: float) -> None:
        self.instance = instance
        self.payload = payload
        self.called_at = called_at
        self.started = False
        self.timing: BatchTiming | None = None


@dataclass(frozen=True, slots=True)
class Window:
    """What was served since the last window, as the handler counted it."""

    latencies_s: list[float]
    queue_waits_s: list[float]
    batch_sizes: dict[int, int]


class BatchCounters:
    """Totals since the replica started, and the window since the last `take_window`.

    Every call is one arrival; it waits until its batch starts (or it is cancelled
    first), then completes or fails with its batch. Ray's batch loop and this run on the
    replica's one event loop, so no locking is needed."""

    def __init__(self) -> None:
        self.arrivals = 0
        self.completed = 0
        self.failed = 0
        self.cancelled = 0
        self.batches = 0
        self.busy_s = 0.0
        self.waiting = 0
        self._window = Window([], [], {})

    def arrived(self) -> None:
        self.arrivals += 1
        self.waiting += 1

    def left_unserved(self) -> None:
        """A call that went away (cancelled) before its batch started."""
        self.waiting -= 1
        self.cancelled += 1

    def started(self, calls: list[QueuedCall], now: float) -> None:
        self.waiting -= len(calls)
        for call in calls:
            call.started = True
        self._window.queue_waits_s.extend(now - c.called_at for c in calls)

    def finished(self, calls: list[QueuedCall], started_at: float, now: float, ok: bool) -> None:
        self.batches += 1
        self.busy_s += now - started_at
        if not ok:
            self.failed += len(calls)
            return
        self.completed += len(calls)
        sizes = self._window.batch_sizes
        sizes[len(calls)] = sizes.get(len(calls), 0) + 1
        self._window.latencies_s.extend(now - c.called_at for c in calls)

    def take_window(self) -> Window:
        window, self._window = self._window, Window([], [], {})
        return window


# -- the engine ------------------------------------------------------------------------


class BatchKnobs(Protocol):
    """What `@serve.batch` offers on the decorated method: its per-replica setters."""

    def set_max_batch_size(self, new_max_batch_size: int) -> None: ...

    def set_batch_wait_timeout_s(self, new_batch_wait_timeout_s: float) -> None: ...


WarmHook = Callable[[int], Awaitable[None]]


class RayServeEngine:
    """One replica's `@serve.batch` queue as an `Engine`.

    A config applies through the setters at once (microseconds; Ray reads them when it
    forms its next batch). With a warm hook the cap served is at most the largest warmed
    bucket: buckets up to the config's warm target are warmed in the background,
    smallest first, and lowering releases those above the new target at once, as Tidal's
    worker does. The change cost is the mean measured warm-up per bucket (0 until one
    ran, and always 0 without a hook).
    """

    kind = KIND

    def __init__(
        self,
        knobs: BatchKnobs,
        worker: str,
        initial: BatchConfig,
        max_concurrent_batches: int,
        max_ongoing_requests: Callable[[], int],
        warm: WarmHook | None,
        clock: Clock,
        errors: BackgroundErrors,
        window_s: float = 1.0,
    ) -> None:
        self.knobs = knobs
        self.worker = worker
        self.config = initial
        self.max_concurrent_batches = max_concurrent_batches
        self.max_ongoing_requests = max_ongoing_requests
        self.clock = clock
        self.errors = errors
        self.window_s = window_s
        self.counters = BatchCounters()
        self.warmup_s: dict[int, float] = {}  # measured, by bucket
        self.config_applied_at: float | None = None  # Unix time the version took effect
        self._version = 0
        self._warm = warm
        self._warmup = WarmupTracker(None, 0)  # nothing is warm before the hook ran
        self._warm_status = WarmupStatus((), ())
        self._warm_task: asyncio.Task | None = None
        self._window_started_at: float | None = None
        self._last_waits_ms: dict[str, float] | None = None
        self._reported = (0, 0, 0.0)  # arrivals, completed, busy seconds at the last window

    # -- Engine ------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def change_cost(self) -> ChangeCost:
        measured = self.warmup_s.values()
        return ChangeCost(warmup_per_bucket_s=sum(measured) / len(measured) if measured else 0.0)

    async def apply(self, published: VersionedConfig) -> None:
        config = published.config
        check_cap(config.max_batch_size, self.max_concurrent_batches, self.limit)
        self.config, self._version = config, published.version
        self._request_warm_target()
        self._set_knobs()
        self.config_applied_at = time.time()

    async def collect(self) -> WorkerStats:
        window = self.counters.take_window()
        c = self.counters
        totals = (c.arrivals, c.completed, c.busy_s)
        last, self._reported = self._reported, totals
        histogram = LatencyHistogram.from_samples(np.array(window.latencies_s))
        nonzero = np.flatnonzero(histogram.counts)
        self._last_waits_ms = _summary_ms(window.queue_waits_s)
        return WorkerStats(
            worker=self.worker,
            window_s=self._measure_window_s(),
            arrivals=totals[0] - last[0],
            completed=totals[1] - last[1],
            shed=0,  # Ray's router holds back what a replica cannot take; none is shed here
            latency_buckets=tuple((int(i), int(histogram.counts[i])) for i in nonzero),
            latency_sum_s=histogram.sum_s,
            batch_sizes=tuple(sorted(window.batch_sizes.items())),
            busy_s=totals[2] - last[2],
            queue_depth=c.waiting,
            max_batch_size=self.serving_cap,
            warmed_buckets=self.warmed_buckets,
            config_version=self._version,
        )

    def status(self) -> dict[str, Any]:
        c = self.counters
        return {
            "queue_depth": c.waiting,
            "serving_max_batch": self.serving_cap,
            "warmed_buckets": None if self.warmed_buckets is None else list(self.warmed_buckets),
            "warming": list(self._warm_status.warming),
            "batch_wait_timeout_s": self.config.timeout_s,
            "max_concurrent_batches": self.max_concurrent_batches,
            "max_ongoing_requests": self.limit,
            "config_applied_at": self.config_applied_at,
            "failed": c.failed,
            "cancelled": c.cancelled,
            "queue_wait_ms": self._last_waits_ms,
            "background_errors": dict(self.errors.counts),
        }

    # -- levels ------------------------------------------------------------------

    @property
    def limit(self) -> int:
        """The deployment's max_ongoing_requests: what a cap must fit under."""
        return self.max_ongoing_requests()

    @property
    def serving_cap(self) -> int:
        if self._warm is None:
            return self.config.max_batch_size
        return min(self.config.max_batch_size, self._warm_status.warm_cap or 1)

    @property
    def warmed_buckets(self) -> tuple[int, ...] | None:
        return None if self._warm is None else self._warm_status.warmed

    # -- lifecycle ---------------------------------------------------------------

    def begin(self) -> None:
        """Serve the initial config (warming its buckets first) and start the first window."""
        self._window_started_at = self.clock.now()
        self._request_warm_target()
        self._set_knobs()

    async def warmed(self) -> None:
        """Return once no warm-up is under way (the initial one, at join)."""
        while self._warm_task is not None and not self._warm_task.done():
            await asyncio.wait({self._warm_task})

    async def close(self) -> None:
        if self._warm_task is not None:
            await cancel_and_wait(self._warm_task)

    # -- internals ---------------------------------------------------------------

    def _set_knobs(self) -> None:
        self.knobs.set_max_batch_size(self.serving_cap)
        self.knobs.set_batch_wait_timeout_s(self.config.timeout_s)

    def _measure_window_s(self) -> float:
        now = self.clock.now()
        started_at, self._window_started_at = self._window_started_at, now
        return self.window_s if started_at is None else now - started_at

    def _request_warm_target(self) -> None:
        """Tell the tracker what should be warm; start or stop the warm task to match."""
        if self._warm is None:
            return
        target = self.config.warm_target
        self._set_warm_status(lambda now: self._warmup.request(target, now))
        if not self._warm_status.warming:
            if self._warm_task is not None:
                self._warm_task.cancel()  # released: a warm-up under way is of no use
                self._warm_task = None
        elif self._warm_task is None:
            self._warm_task = spawn(self._warm_up(), "warm-up", self.errors, self._warm_failed)

    async def _warm_up(self) -> None:
        assert self._warm is not None
        try:
            while self._warm_status.warming:
                bucket = self._warm_status.warming[0]
                started = self.clock.now()
                await self._warm(bucket)
                self.warmup_s[bucket] = self.clock.now() - started
                self._set_warm_status(lambda now, b=bucket: self._warmup.mark_warm(b, now))
                self._set_knobs()  # the larger cap serves once its bucket is warm
        finally:
            if self._warm_task is asyncio.current_task():
                self._warm_task = None

    def _warm_failed(self, error: BaseException) -> None:
        """A warm-up hook raised (logged and counted by `spawn`): serve what is warm."""
        self._set_warm_status(self._warmup.abandon)
        self._set_knobs()

    def _set_warm_status(self, change: Callable[[float], Any]) -> None:
        now = self.clock.now()
        change(now)
        self._warm_status = self._warmup.status(now)


def _summary_ms(samples_s: list[float]) -> dict[str, float] | None:
    if not samples_s:
        return None
    values = np.array(samples_s) * 1e3
    return {
        "mean": round(float(values.mean()), 3),
        "p50": round(float(np.quantile(values, 0.5)), 3),
        "p99": round(float(np.quantile(values, 0.99)), 3),
    }


# -- the replica's membership -----------------------------------------------------------


class Membership:
    """One decorated method's pool membership in this replica (Ray's batch queue is per
    method and per process, and so is this): joined once, on the replica's loop."""

    def __init__(
        self,
        initial: BatchConfig,
        max_concurrent_batches: int,
        max_ongoing_requests: int | None,
        warmup: Callable[..., Any] | None,
        settings: MemberSettings,
        name: str | None,
    ) -> None:
        self.initial = initial
        self.max_concurrent_batches = max_concurrent_batches
        self.fixed_max_ongoing = max_ongoing_requests
        self.warmup = warmup
        self.settings = settings
        self.name = name
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
        keep = ("initial", "max_concurrent_batches", "fixed_max_ongoing", "warmup")
        return {k: getattr(self, k) for k in (*keep, "settings", "name", "batched")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def join(self, instance: Any) -> None:
        """Join the pool (once), on the running loop: report, follow the pool's config,
        warm the initial cap's buckets (the cap serves once they are warm)."""
        if self.engine is not None:
            return
        settings = self.settings.resolved(os.environ)
        context = serve.get_replica_context()
        worker = f"{self.name or context.deployment}-{context.replica_tag}"
        engine = RayServeEngine(
            self.batched,
            worker,
            self.initial,
            self.max_concurrent_batches,
            self._max_ongoing_requests,
            self._warm_hook(instance),
            self.clock,
            self.errors,
            settings.interval_s,
        )
        self._warn_if_initial_cap_does_not_fit(engine)
        self._bus = RedisBus(connect(settings.redis_url), prefix=settings.redis_prefix)
        self.member = PoolMember(
            engine,
            self._bus,
            settings.pool,
            worker,
            self.clock,
            self.errors,
            interval_s=settings.interval_s,
            heartbeat_ttl_s=settings.heartbeat_ttl_s,
        )
        engine.begin()
        self.member.start()
        self.engine = engine
        log.info("%s joined pool %s (prefix %s)", worker, settings.pool, settings.redis_prefix)

    def _warn_if_initial_cap_does_not_fit(self, engine: RayServeEngine) -> None:
        """The starting config is the code's, not the pool's: serve it as Ray does, but
        say so (a published config that does not fit is refused)."""
        try:
            check_cap(self.initial.max_batch_size, self.max_concurrent_batches, engine.limit)
        except ConfigRejected as error:
            log.warning("%s: the starting config does not fit: %s", engine.worker, error)

    def _max_ongoing_requests(self) -> int:
        if self.fixed_max_ongoing is not None:
            return self.fixed_max_ongoing
        # Read live: a redeploy can change it in place. Ray's own batching reads it here.
        return serve.get_replica_context()._deployment_config.max_ongoing_requests

    def _warm_hook(self, instance: Any) -> WarmHook | None:
        hook = self.warmup
        if hook is None:
            return None
        if inspect.iscoroutinefunction(hook):
            return functools.partial(hook, instance)

        async def in_thread(bucket: int) -> None:  # the loop keeps serving meanwhile
            await asyncio.to_thread(hook, instance, bucket)

        return in_thread

    async def leave(self) -> None:
        """Send the last window, stop the member's loops and close the client."""
        if self.member is not None:
            await self.member.stop()
        if self.engine is not None:
            await self.engine.close()
        if self._bus is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._bus.client.aclose()
        self._reset()

    async def call(self, instance: Any, payload: Any) -> tuple[Any, BatchTiming]:
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


# -- the decorator and its helpers ------------------------------------------------------


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
    initial = BatchConfig(max_batch_size, batch_wait_timeout_s)
    if isinstance(max_concurrent_batches, bool) or not isinstance(max_concurrent_batches, int):
        raise InvalidInput(
            f"max_concurrent_batches must be an integer, got {max_concurrent_batches!r}"
        )
    if max_concurrent_batches < 1:
        raise InvalidInput(f"max_concurrent_batches must be >= 1, got {max_concurrent_batches}")
    if max_ongoing_requests is not None:
        try:
            check_cap(max_batch_size, max_concurrent_batches, max_ongoing_requests)
        except ConfigRejected as error:
            raise InvalidInput(f"tidal_batch: {error}") from None
    settings = MemberSettings(pool, redis_url, redis_prefix, interval_s, heartbeat_ttl_s)

    def decorate(func: Callable) -> Callable:
        if not inspect.iscoroutinefunction(func):
            raise InvalidInput(f"tidal_batch: {func.__qualname__} must be an async def")
        membership = Membership(
            initial, max_concurrent_batches, max_ongoing_requests, warmup, settings, name
        )

        async def run_batch(calls: list[QueuedCall]) -> list:
            return await membership.run_batch(func, calls)

        run_batch.__name__ = run_batch.__qualname__ = func.__name__  # Ray's metrics tag
        batched = serve.batch(
            max_batch_size=max_batch_size,
            batch_wait_timeout_s=batch_wait_timeout_s,
            max_concurrent_batches=max_concurrent_batches,
        )(run_batch)
        membership.batched = batched

        @functools.wraps(func)
        async def method(self: Any, item: Any) -> Any:
            return (await membership.call(self, item))[0]

        method.__tidal__ = membership  # type: ignore[attr-defined]
        method.set_max_batch_size = batched.set_max_batch_size  # type: ignore[attr-defined]
        method.set_batch_wait_timeout_s = batched.set_batch_wait_timeout_s  # type: ignore[attr-defined]
        return method

    return decorate(_func) if _func is not None else decorate


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
    """Leave the pool cleanly (the last window sent): await it in `async def __del__`."""
    await membership(method).leave()
