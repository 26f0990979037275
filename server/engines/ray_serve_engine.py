"""One Ray Serve replica's `@serve.batch` queue as an `Engine` (server/engines/protocols.py).

`@serve.batch` gives the decorated method two public setters, `set_max_batch_size` and
`set_batch_wait_timeout_s`, held by the replica's own batch queue and read when Ray forms
its next batch: a config applies through them at once. A cap the deployment's
`max_ongoing_requests` cannot hold is refused (`check_cap`); the old config serves on.

With a warm-up hook (for models that prepare per batch size: compiled shapes, CUDA
graphs), raising the cap warms the missing power-of-two buckets first, one after another,
while the old cap serves (`adaptive.warmup.WarmupTracker`, the worker's state machine,
fed the measured warm-ups); without one, warm-up is not modelled (`warmed_buckets` None).
A sync hook runs on a thread, which cannot be stopped: a cancelled warm-up (its buckets
released, the replica leaving) is joined, not abandoned, so that nothing of it runs on
beside the next warm-up or after `close()`.

The stats are the handler's own counts (`BatchCounters`). No Ray here: the setters are a
protocol, so the engine runs in tests on recorded knobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.change_cost import ChangeCost
from adaptive.clock import Clock
from adaptive.config import BatchConfig
from adaptive.histogram import LatencyHistogram
from adaptive.warmup import WarmupStatus, WarmupTracker
from server.engines.ray_serve_counters import BatchCounters
from server.engines.ray_serve_settings import check_cap
from server.tasks import BackgroundErrors, cancel_and_wait, spawn

KIND = "ray-serve"


class BatchKnobs(Protocol):
    """What `@serve.batch` offers on the decorated method: its per-replica setters."""

    def set_max_batch_size(self, new_max_batch_size: int) -> None: ...

    def set_batch_wait_timeout_s(self, new_batch_wait_timeout_s: float) -> None: ...


WarmHook = Callable[[int], Awaitable[None]]


def warm_hook(hook: Callable[..., Any] | None, instance: Any) -> WarmHook | None:
    """The decorator's `warmup` method bound to the replica's instance: an async one as
    it is, a sync one on a thread (the loop keeps serving meanwhile), joined if cancelled."""
    if hook is None:
        return None
    if inspect.iscoroutinefunction(hook):
        return functools.partial(hook, instance)

    async def on_thread(bucket: int) -> None:
        await run_joined(functools.partial(hook, instance, bucket))

    return on_thread


async def run_joined(call: Callable[[], Any]) -> None:
    """Run the blocking `call` on a thread. A thread cannot be stopped, so a cancellation
    waits for `call` to return before it propagates: once the cancelled task has ended,
    nothing of it runs on. What `call` returned or raised by then is of no use, and
    dropped."""
    running = asyncio.ensure_future(asyncio.to_thread(call))
    try:
        await asyncio.shield(running)
    except asyncio.CancelledError:
        await _join(running)
        raise


async def _join(running: asyncio.Future) -> None:
    """Wait for `running` to end through any number of cancellations (`cancel_and_wait`
    repeats its cancel until the task ends)."""
    while not running.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({running})
    if not running.cancelled():
        running.exception()  # retrieved, so asyncio does not log it as never retrieved


class RayServeEngine:
    """One replica's `@serve.batch` queue as an `Engine`.

    A config applies through the setters at once (microseconds; Ray reads them when it
    forms its next batch). With a warm hook the cap served is at most the largest warmed
    bucket: buckets up to the config's warm target are warmed in the background,
    smallest first, and lowering releases those above the new target at once, as Tidal's
    worker does. One hook runs at a time, a released one included until it has returned.
    The change cost is the mean measured warm-up per bucket (0 until one ran, and always
    0 without a hook).
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
        self._hook_turn = asyncio.Lock()  # held while a hook runs, until it has returned
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
        self._last_waits_ms = window.queue_wait_summary_ms()
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
        """Stop warming; return once no hook runs (a released one may still be ending)."""
        if self._warm_task is not None:
            await cancel_and_wait(self._warm_task)
        async with self._hook_turn:
            pass

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
        try:
            while self._warm_status.warming:
                await self._warm_next()
        finally:
            if self._warm_task is asyncio.current_task():
                self._warm_task = None

    async def _warm_next(self) -> None:
        """Warm the next pending bucket, once any released warm-up has returned; the
        larger cap serves once its bucket is warm."""
        assert self._warm is not None
        async with self._hook_turn:
            if not self._warm_status.warming:
                return
            bucket = self._warm_status.warming[0]
            started = self.clock.now()
            await self._warm(bucket)
            self.warmup_s[bucket] = self.clock.now() - started
        self._set_warm_status(lambda now: self._warmup.mark_warm(bucket, now))
        self._set_knobs()

    def _warm_failed(self, error: BaseException) -> None:
        """A warm-up hook raised (logged and counted by `spawn`): serve what is warm."""
        self._set_warm_status(self._warmup.abandon)
        self._set_knobs()

    def _set_warm_status(self, change: Callable[[float], Any]) -> None:
        now = self.clock.now()
        change(now)
        self._warm_status = self._warmup.status(now)
