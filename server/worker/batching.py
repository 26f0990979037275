"""The live dynamic batcher: `adaptive.Batcher` driven by an asyncio shell.

Requests are offered to the state machine as they arrive; the dispatch loop sleeps until
the batcher's next deadline or the next queued request's own deadline (or an arrival, a
config change, a freed instance), answers 504 to every request whose deadline has passed
(at its deadline, not when a batch forms: a client that gives up should hear so then),
and hands each due batch to a model instance on a worker thread, so accepting requests
never waits behind inference. One batch is in flight per instance.

Admission follows a `QueueLimit` (server/worker/admission.py): by default none, the
worker's command line bounds it from the SLO and the service rate measured here.

Configs apply at the next batch formation; the queue is never touched, so nothing is
dropped, duplicated or reordered. Raising the cap past the warmed buckets warms the
missing buckets in the background (smallest first) while the old cap serves, as the
simulator's warm-up model says; batches run padded to the smallest warmed bucket.
Warm-up is a collaborator, `BucketWarmer` (server/worker/warming.py), on
`adaptive.warmup.WarmupTracker`'s rules, fed the measured warm-ups: raising warms the
missing buckets one after another, lowering is instant and releases the buckets above
the new warm target (an abandoned warm-up is cancelled). Given the model's memory limit
(server/worker/memory.py), the cap the worker accepts starts at the largest batch that
fits: a config asking more (from the pool's controller) is clamped to it and said once
in the log, and the top bucket is padded and warmed only up to it, as the simulator
clamps its caps. A batch that runs out of memory is split in half and retried until it
runs; a bucket that runs out of memory while warming ends the warm-up; either way the
accepted cap is lowered to what ran (or warmed).

Time comes from a `Clock`: by default `time.perf_counter()`
(`server.clock.MonotonicClock`), so queue waits, execution times and latencies are
measured to the microsecond, not in the whole milliseconds of uvloop's `loop.time()`;
deadlines are read on it too, and slept for on the loop. Tests pass the loop's clock
(`LoopClock`) instead and model calls go through an `Execution` (threads, by default),
so under a virtual-time loop with a modelled execution every dispatch instant is exact.
What a pool's collector reads is kept in `StatsWindows` (server/worker/windows.py).
Background tasks are supervised: a failure is logged, counted and, for the dispatch
loop, makes the worker unready.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from adaptive.batcher import Batcher, Queued
from adaptive.clock import Clock
from adaptive.config import BatchConfig
from adaptive.grouped import GroupedBatcher
from adaptive.latency import MemoryLimit
from adaptive.warmup import bucket_for
from server.clock import MonotonicClock
from server.tasks import BackgroundErrors, spawn
from server.worker.admission import QueueLimit, ServiceRate
from server.worker.memory import describe_memory
from server.worker.runner import Execution, ModelRunner, OutOfMemory, ThreadedExecution
from server.worker.warming import BucketWarmer
from server.worker.windows import StatsWindows
from tidal_base.errors import TidalError

log = logging.getLogger("tidal.worker")

SPIN_S = 0.0015
"""Within this much of a deadline the loop yields instead of sleeping (see _sleep_until)."""


class QueueFull(TidalError):
    """The bounded queue is full: the caller should retry later (HTTP 429)."""


class DeadlineExceeded(TidalError):
    """The request's deadline passed while it waited in the queue (HTTP 504)."""


class ShuttingDown(TidalError):
    """The worker is draining and accepts no new requests (HTTP 503)."""


class WorkerFailed(TidalError):
    """The dispatch loop died, so nothing queued would ever run (HTTP 503)."""


@dataclass(frozen=True, slots=True)
class Served:
    """One request's answer and how it was served."""

    output: Any
    queue_wait_s: float
    batch_size: int
    padded_size: int
    execution_s: float


@dataclass
class _Request:
    item: Any
    future: asyncio.Future[Served]


@dataclass
class BatcherStats:
    """Counters since start; the metrics and the bus read them."""

    arrivals: int = 0
    completed: int = 0
    shed: int = 0
    expired: int = 0
    failed: int = 0
    batches: int = 0
    batch_size_sum: int = 0
    padded_size_sum: int = 0
    busy_s: float = 0.0
    oom_splits: int = 0
    warmup_ooms: int = 0
    padding_waste_sum: float = 0.0
    warmup_s: dict[int, float] = field(default_factory=dict)


class DynamicBatcher:
    """Accepts requests, forms batches by the batching rule, runs them on model instances.

    queue_limit: how many requests may wait (default: unbounded); past it, `QueueFull`.
    memory: the model's memory limit, which bounds every cap (default: none known).
    clock: where time comes from (default: `time.perf_counter()`; a virtual-time test
        passes the loop's).
    execution: how model calls are awaited (default: `runner` on `instances` threads).
    spin_s: how close to a deadline the loop yields instead of sleeping, because the
        selector sleeps in whole milliseconds; 0 on a virtual-time loop, whose timers
        are exact (and whose time never moves while a task only yields).
    """

    def __init__(
        self,
        runner: ModelRunner,
        config: BatchConfig,
        *,
        instances: int = 1,
        queue_limit: QueueLimit | None = None,
        memory: MemoryLimit | None = None,
        warm_at_start: bool = True,
        padding_waste=None,
        group_key=None,
        clock: Clock | None = None,
        execution: Execution | None = None,
        spin_s: float = SPIN_S,
    ) -> None:
        self.runner = runner
        self.instances = instances
        self.clock = clock if clock is not None else MonotonicClock()
        self.spin_s = spin_s
        self.stats = BatcherStats()
        self.errors = BackgroundErrors()  # the link records its loops' failures here too
        self.config = config  # as asked; the batcher serves min(cap, warmed)
        self.version = 0
        self.queue_limit = queue_limit if queue_limit is not None else QueueLimit()
        self._service_rate = ServiceRate(instances)
        self.memory = memory
        # What fits in memory; lowered after running out of memory all the same.
        self.accepted_cap: int | None = self.memory_max_batch
        self._clamp_logged = False
        self.failure: BaseException | None = None  # why the dispatch loop died, if it did
        self._padding_waste = padding_waste
        # With a group key (a length bucket), each group is batched on its own.
        self._batcher: Batcher[_Request] | GroupedBatcher[_Request] = (
            Batcher(config)
            if group_key is None
            else GroupedBatcher(config, lambda request: group_key(request.item))
        )
        self._execution = (
            execution if execution is not None else ThreadedExecution(runner, instances)
        )
        # Measured warm-ups: nothing is warm yet, or (warm_at_start=False) the config's
        # buckets are taken as warm.
        self.warmer = BucketWarmer(
            self._execution,
            self.clock,
            self.errors,
            0 if warm_at_start else config.warm_target,
            run_size=self._bounded,
            on_warmed=self._bucket_warmed,
            on_out_of_memory=self._warm_out_of_memory,
            on_abandoned=self._apply_serving_config,
        )
        self.windows = StatsWindows()  # what a pool's StatsCollector takes
        self._free = instances
        self._wake = asyncio.Event()
        self._sleeping_until = -math.inf  # when the sleeping loop wakes by itself
        self._closing = False
        self._in_flight: set[asyncio.Task] = set()
        self._loop_task: asyncio.Task | None = None
        self.on_batch = None  # called with (size, cap in force, execution seconds)
        self.on_dispatch = None  # called with seconds between when a batch was due and left
        self._free_since = 0.0  # when an instance last became free after all were busy

    # -- public ------------------------------------------------------------------

    async def start(self) -> None:
        self._loop_task = spawn(self._dispatch_loop(), "dispatch", self.errors, self._dispatch_died)
        self.reconfigure(self.config)
        self.warmer.begin()

    @property
    def warmed_up(self) -> bool:
        """The starting config's buckets are warm (until then the worker is not ready)."""
        return self.warmer.warmed_up

    @property
    def warmed_buckets(self) -> tuple[int, ...]:
        return self.warmer.status.warmed

    @property
    def warming_buckets(self) -> tuple[int, ...]:
        """The buckets being warmed, the next one first."""
        return self.warmer.status.warming

    @property
    def warming(self) -> bool:
        return bool(self.warmer.status.warming)

    @property
    def ready(self) -> bool:
        """Serving: the dispatch loop runs (or has not started yet)."""
        return self.failure is None

    @property
    def queue_depth(self) -> int:
        return len(self._batcher)

    @property
    def service_rate_rps(self) -> float | None:
        """Requests per second the instances cleared over their recent batches."""
        return self._service_rate.rate_rps

    @property
    def queue_bound(self) -> int | None:
        """The most requests that may wait now (None: unbounded); see `QueueLimit`."""
        return self.queue_limit.bound(self.service_rate_rps, self.serving_cap * self.instances)

    @property
    def memory_max_batch(self) -> int | None:
        """The largest batch the model's memory allows (None: no limit known)."""
        return None if self.memory is None else self.memory.max_batch_size

    def limits(self) -> dict[str, Any]:
        """The admission bound and what it is made of, and the memory bound, for /v1/stats."""
        rate = self.service_rate_rps
        return {
            "queue_bound": self.queue_bound,
            "queue_bound_rule": self.queue_limit.rule,
            "slo_ms": None if self.queue_limit.wait_s is None else self.queue_limit.wait_s * 1e3,
            "service_rate_rps": None if rate is None else round(rate, 3),
            "memory_max_batch": self.memory_max_batch,
        }

    @property
    def serving_cap(self) -> int:
        cap = min(self.config.max_batch_size, self.warmer.status.warm_cap or 1)
        return min(cap, self.accepted_cap) if self.accepted_cap else cap

    async def submit(self, item: Any, deadline_s: float | None = None) -> Served:
        """Queue one validated input; resolves when its batch has run."""
        if self.failure is not None:
            raise WorkerFailed(f"the dispatch loop died ({self.failure!r}); see the log")
        if self._closing:
            raise ShuttingDown("the worker is draining and takes no new requests")
        now = self.clock.now()
        request = _Request(item, asyncio.get_running_loop().create_future())
        self.stats.arrivals += 1
        self._answer_expired(now)  # an expired request's place is free from its deadline
        self._admit()
        self._batcher.offer(request, now, None if deadline_s is None else now + deadline_s)
        self._wake_for_arrival()
        return await request.future

    def _admit(self) -> None:
        """Shed (`QueueFull`) when the queue holds its bound already."""
        bound = self.queue_bound
        if bound is not None and len(self._batcher) >= bound:
            self.stats.shed += 1
            rate, floor = self.service_rate_rps, self.serving_cap * self.instances
            explained = self.queue_limit.explain(rate, floor)
            raise QueueFull(f"queue full ({len(self._batcher)} waiting, {explained})")

    def reconfigure(self, config: BatchConfig, version: int | None = None) -> None:
        """Apply from the next batch formation; warm missing buckets in the background,
        release those above the new warm target at once."""
        self.config = config
        if version is not None:
            self.version = version
        self._say_clamped_once(config)
        self._request_warm_target()
        self._apply_serving_config()

    def _say_clamped_once(self, config: BatchConfig) -> None:
        """A config above the memory bound is served clamped to it (`accepted_cap`); the
        log says so the first time, /v1/stats every time (a controller may ask each tick)."""
        bound = self.memory_max_batch
        if bound is None or self._clamp_logged or config.warm_target <= bound:
            return
        self._clamp_logged = True
        log.warning(
            "config %s asks for batches above what memory allows: clamped to %d, %s (said "
            "once: see accepted_max_batch in /v1/stats)",
            config.describe(),
            bound,
            describe_memory(self.memory),
        )

    async def drain(self) -> None:
        """Stop accepting, finish everything queued and in flight."""
        self._closing = True
        self._wake.set()
        if self._loop_task is not None:
            await asyncio.wait({self._loop_task})  # a dead loop was reported when it died
        if self._in_flight:  # only if the loop died with batches running
            await asyncio.wait(set(self._in_flight))
        await self.warmer.close()
        self._execution.close()

    # -- the pool's windows (`self.windows`) ------------------------------------------

    def keep_windows(self) -> None:
        """Keep the windows that `take_window`, `take_ingress_window` and
        `take_execution_window` return, from now on; whoever calls this takes them
        regularly (without it none are kept: nothing would ever empty them)."""
        self.windows.keep()

    def take_window(self) -> tuple[list[float], dict[int, int]]:
        """Latencies (queue wait + execution) and batch sizes since the last call."""
        return self.windows.take()

    def record_ingress(self, seconds: float) -> None:
        """How long one request took from the worker's socket to `submit` (the HTTP
        layer's queue and parsing, which the batcher's own latencies do not see)."""
        self.windows.record_ingress(seconds)

    def take_ingress_window(self) -> list[float]:
        """Ingress seconds recorded since the last call."""
        return self.windows.take_ingress()

    def take_execution_window(self) -> dict[int, list[float]]:
        """Execution seconds of each batch run since the last call, by padded size."""
        return self.windows.take_execution()

    # -- the loop ------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            now = self.clock.now()
            self._answer_expired(now)  # first: a request is never taken at its deadline
            if self._closing and not len(self._batcher) and not self._in_flight:
                return
            # A batch is due only to a free instance; draining, it is due at once.
            due_at = self._batcher.next_deadline() if self._free else None
            if due_at is not None and (due_at <= now or self._closing):
                self._dispatch(now, due_at)
            else:
                await self._sleep_until(_earliest(due_at, self._batcher.next_expiry()), now)

    def _answer_expired(self, now: float) -> None:
        for queued in self._batcher.expire(now):
            if not queued.item.future.done():  # else the client went away
                self.stats.expired += 1
                queued.item.future.set_exception(DeadlineExceeded("deadline passed while queued"))

    def _dispatch(self, now: float, due_at: float) -> None:
        batch = self._batcher.take_nowait(max(now, due_at))
        if batch:
            self._launch(batch, now)  # first: a failing hook must not lose the batch
            if self.on_dispatch is not None:
                self.on_dispatch(now - max(due_at, self._free_since))

    def _dispatch_died(self, error: BaseException) -> None:
        """Nothing queued would ever run: fail it, and refuse what comes (not ready)."""
        self.failure = error
        failed = WorkerFailed(f"the dispatch loop died ({error!r})")
        self._fail(self._batcher.drain(), failed)

    async def _sleep_until(self, wake_at: float | None, now: float) -> None:
        """Until `wake_at` (None: until woken). The selector sleeps in whole milliseconds
        (epoll rounds up), so the last stretch before an instant is spent yielding to the
        loop instead of sleeping."""
        if wake_at is None:
            await self._sleep(None, math.inf)
        elif wake_at - now > self.spin_s:
            await self._sleep(wake_at - now - self.spin_s, wake_at - self.spin_s)
        else:
            await asyncio.sleep(0)

    async def _sleep(self, timeout_s: float | None, until: float) -> None:
        """Until woken, or `timeout_s` (None: no timeout), which ends at `until` on the
        clock (what an arrival compares its instants with: `_wake_for_arrival`)."""
        self._wake.clear()
        timer = None
        if timeout_s is not None:
            timer = asyncio.get_running_loop().call_later(timeout_s, self._wake.set)
        self._sleeping_until = until
        try:
            await self._wake.wait()
        finally:
            self._sleeping_until = -math.inf
            if timer is not None:
                timer.cancel()

    def _wake_for_arrival(self) -> None:
        """Wake the sleeping loop if the queue now has an instant before it would wake by
        itself (a batch due to a free instance, a request's deadline); else the arrival
        waits for that wake-up, as the loop would have put itself back to sleep. Most
        arrivals of a batch being formed change neither, and cost no turn of the loop."""
        due_at = self._batcher.next_deadline() if self._free else None
        soonest = _earliest(due_at, self._batcher.next_expiry())
        if soonest is not None and soonest < self._sleeping_until:
            self._wake.set()

    def _launch(self, batch: list[Queued[_Request]], now: float) -> None:
        live = [queued for queued in batch if not queued.item.future.done()]  # else gone
        if not live:
            return
        self._free -= 1
        task = spawn(
            self._execute(live, now),
            "batch",
            self.errors,
            lambda error: self._fail(live, WorkerFailed(f"the batch task failed ({error!r})")),
        )
        self._in_flight.add(task)

    async def _execute(self, batch: list[Queued[_Request]], dispatched_at: float) -> None:
        try:
            await self._run_splitting(batch, dispatched_at)
        finally:
            # Out of the in-flight set before the wake-up, or a draining loop woken by
            # it sees the batch still in flight and sleeps for good (a lost wake-up).
            self._in_flight.discard(asyncio.current_task())
            if self._free == 0:
                self._free_since = self.clock.now()
            self._free += 1
            self._wake.set()

    async def _run_splitting(self, batch: list[Queued[_Request]], dispatched_at: float) -> None:
        inputs = [q.item.item for q in batch]
        padded = self._padded_size(len(inputs))
        started = self.clock.now()
        try:
            outputs = await self._execution.run(inputs, padded)
        except OutOfMemory:
            if len(batch) == 1:
                self._fail(batch, RuntimeError("a single request does not fit in memory"))
                return
            self.stats.oom_splits += 1
            half = len(batch) // 2
            self._accept_at_most(half)
            self._request_warm_target()  # buckets above what fits are released
            await self._run_splitting(batch[:half], dispatched_at)
            await self._run_splitting(batch[half:], dispatched_at)
            return
        except Exception as error:  # the model failed: answer every request in the batch
            self._fail(batch, error)
            return
        self._complete(batch, outputs, padded, dispatched_at, self.clock.now() - started)

    def _complete(
        self, batch, outputs, padded: int, dispatched_at: float, execution_s: float
    ) -> None:
        s = self.stats
        s.batches += 1
        s.batch_size_sum += len(batch)
        s.padded_size_sum += padded
        s.busy_s += execution_s
        self._service_rate.record(len(batch), execution_s)
        if self._padding_waste is not None:
            s.padding_waste_sum += self._padding_waste([q.item.item for q in batch])
        if self.on_batch is not None:
            self.on_batch(len(batch), self.serving_cap, execution_s)
        self.windows.record_batch(batch, padded, dispatched_at + execution_s, execution_s)
        for queued, output in zip(batch, outputs, strict=True):
            s.completed += 1
            if not queued.item.future.done():
                queued.item.future.set_result(
                    Served(
                        output, dispatched_at - queued.arrived_at, len(batch), padded, execution_s
                    )
                )

    def _fail(self, batch: Sequence[Queued[_Request]], error: Exception) -> None:
        for queued in batch:
            if not queued.item.future.done():
                self.stats.failed += 1
                queued.item.future.set_exception(error)

    def _padded_size(self, size: int) -> int:
        bucket = bucket_for(size)
        return self._bounded(bucket) if bucket <= max(self.warmer.status.warm_cap, 1) else size

    def _bounded(self, bucket: int) -> int:
        """A bucket as it runs: the top one stops at the memory bound (6239 of 8192)."""
        bound = self.memory_max_batch
        return bucket if bound is None else min(bucket, bound)

    # -- warm-up (`self.warmer`) -------------------------------------------------------

    def _request_warm_target(self) -> None:
        """Warm what the config asks, up to what fits (what does not is not warmed)."""
        target = self.config.warm_target
        if self.accepted_cap is not None:
            target = min(target, self.accepted_cap)
        self.warmer.request(target)

    def _bucket_warmed(self, bucket: int, seconds: float) -> None:
        self.stats.warmup_s[bucket] = seconds
        self._apply_serving_config()

    def _warm_out_of_memory(self, bucket: int, error: OutOfMemory) -> None:
        """Like a batch that does not fit: counted, and the cap lowered to what warmed."""
        self.stats.warmup_ooms += 1
        self._accept_at_most(max(1, bucket // 2))
        log.warning(
            "bucket %d ran out of memory while warming (%s): accepting batches of up to %d",
            bucket,
            error,
            self.accepted_cap,
        )

    def _accept_at_most(self, cap: int) -> None:
        self.accepted_cap = max(1, min(self.accepted_cap or cap, cap))
        self._apply_serving_config()

    def _apply_serving_config(self) -> None:
        self._batcher.reconfigure(BatchConfig(max(1, self.serving_cap), self.config.timeout_s))
        self._wake.set()


def _earliest(*instants: float | None) -> float | None:
    """The soonest of the instants given; None if there is none."""
    return min((t for t in instants if t is not None), default=None)
