"""The live dynamic batcher: `adaptive.Batcher` driven by an asyncio shell.

Requests are offered to the state machine as they arrive; the dispatch loop sleeps until
the batcher's next deadline (or an arrival, a config change, a freed instance) and hands
each due batch to a model instance on a worker thread, so accepting requests never waits
behind inference. One batch is in flight per instance.

Configs apply at the next batch formation; the queue is never touched, so nothing is
dropped, duplicated or reordered. Raising the cap past the warmed buckets warms the
missing buckets in the background (smallest first) while the old cap serves, as the
simulator's warm-up model says; batches run padded to the smallest warmed bucket.
A batch that runs out of memory is split in half and retried until it runs, and the cap
the worker accepts is lowered to what ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from adaptive.batcher import Batcher, Queued
from adaptive.config import BatchConfig
from adaptive.grouped import GroupedBatcher
from adaptive.warmup import bucket_for, buckets_through
from server.worker.runner import ModelRunner, OutOfMemory
from tidal_base.errors import TidalError

SPIN_S = 0.0015
"""Within this much of a deadline the loop yields instead of sleeping (see _sleep_until)."""


class QueueFull(TidalError):
    """The bounded queue is full: the caller should retry later (HTTP 429)."""


class DeadlineExceeded(TidalError):
    """The request's deadline passed while it waited in the queue (HTTP 504)."""


class ShuttingDown(TidalError):
    """The worker is draining and accepts no new requests (HTTP 503)."""


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
    deadline_at: float | None


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
    padding_waste_sum: float = 0.0
    warmup_s: dict[int, float] = field(default_factory=dict)


class DynamicBatcher:
    """Accepts requests, forms batches by the batching rule, runs them on model instances."""

    def __init__(
        self,
        runner: ModelRunner,
        config: BatchConfig,
        *,
        instances: int = 1,
        max_queue: int | None = None,
        warm_at_start: bool = True,
        padding_waste=None,
        group_key=None,
    ) -> None:
        self.runner = runner
        self.instances = instances
        self.stats = BatcherStats()
        self.config = config  # as asked; the batcher serves min(cap, warmed)
        self.version = 0
        self.accepted_cap: int | None = None  # lowered after an out-of-memory split
        self._padding_waste = padding_waste
        # With a group key (a length bucket), each group is batched on its own.
        self._batcher: Batcher[_Request] | GroupedBatcher[_Request] = (
            Batcher(config, max_queue)
            if group_key is None
            else GroupedBatcher(config, lambda request: group_key(request.item), max_queue)
        )
        self._warm_top = bucket_for(config.warm_target) if not warm_at_start else 0
        self._executor = ThreadPoolExecutor(instances, thread_name_prefix="model")
        self._warm_executor = ThreadPoolExecutor(1, thread_name_prefix="warmup")
        self._free = instances
        self._wake = asyncio.Event()
        self._closing = False
        self._in_flight: set[asyncio.Task] = set()
        self._warming: asyncio.Task | None = None
        self._loop_task: asyncio.Task | None = None
        self.on_batch = None  # called with (size, cap in force, execution seconds)
        self.on_dispatch = None  # called with seconds between when a batch was due and left
        self._free_since = 0.0  # when an instance last became free after all were busy
        self._window_latencies: list[float] = []  # since the last take_window()
        self._window_batches: dict[int, int] = {}

    # -- public ------------------------------------------------------------------

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._dispatch_loop(), name="dispatch")
        self.reconfigure(self.config)

    @property
    def warmed_buckets(self) -> tuple[int, ...]:
        return buckets_through(self._warm_top) if self._warm_top else ()

    @property
    def warming(self) -> bool:
        return self._warming is not None and not self._warming.done()

    @property
    def queue_depth(self) -> int:
        return len(self._batcher)

    @property
    def serving_cap(self) -> int:
        cap = min(self.config.max_batch_size, self._warm_top or 1)
        return min(cap, self.accepted_cap) if self.accepted_cap else cap

    async def submit(self, item: Any, deadline_s: float | None = None) -> Served:
        """Queue one validated input; resolves when its batch has run."""
        if self._closing:
            raise ShuttingDown("the worker is draining and takes no new requests")
        now = time.monotonic()
        request = _Request(
            item,
            asyncio.get_running_loop().create_future(),
            None if deadline_s is None else now + deadline_s,
        )
        self.stats.arrivals += 1
        if not self._batcher.offer(request, now):
            self.stats.shed += 1
            raise QueueFull(f"queue full ({len(self._batcher)} waiting)")
        self._wake.set()
        return await request.future

    def reconfigure(self, config: BatchConfig, version: int | None = None) -> None:
        """Apply from the next batch formation; warm missing buckets in the background."""
        self.config = config
        if version is not None:
            self.version = version
        self._apply_serving_config()
        if bucket_for(config.warm_target) > self._warm_top and not self.warming:
            self._warming = asyncio.create_task(self._warm_up(), name="warm-up")
        elif bucket_for(config.warm_target) < self._warm_top and not self.warming:
            self._warm_top = bucket_for(config.warm_target)  # release what is not served
            self._apply_serving_config()

    async def drain(self) -> None:
        """Stop accepting, finish everything queued and in flight."""
        self._closing = True
        self._wake.set()
        if self._loop_task is not None:
            await self._loop_task
        if self._warming is not None:
            self._warming.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._warming
        self._executor.shutdown(wait=True)
        self._warm_executor.shutdown(wait=False, cancel_futures=True)

    def take_window(self) -> tuple[list[float], dict[int, int]]:
        """Latencies (queue wait + execution) and batch sizes since the last call."""
        window = self._window_latencies, self._window_batches
        self._window_latencies, self._window_batches = [], {}
        return window

    # -- the loop ------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        while True:
            if self._closing and not len(self._batcher) and not self._in_flight:
                return
            if self._free == 0 or not len(self._batcher):
                await self._sleep(None)
                continue
            deadline = self._batcher.next_deadline()
            now = time.monotonic()
            if deadline is not None and deadline > now and not self._closing:
                await self._sleep_until(deadline, now)
                continue
            batch = self._batcher.take_nowait(max(now, deadline or now))
            if batch:
                if self.on_dispatch is not None and deadline is not None:
                    self.on_dispatch(now - max(deadline, self._free_since))
                self._launch(batch, now)

    async def _sleep_until(self, deadline: float, now: float) -> None:
        """The selector sleeps in whole milliseconds (epoll rounds up), so the last
        stretch before a deadline is spent yielding to the loop instead of sleeping."""
        if deadline - now > SPIN_S:
            await self._sleep(deadline - now - SPIN_S)
        else:
            await asyncio.sleep(0)

    async def _sleep(self, timeout_s: float | None) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)

    def _launch(self, batch: list[Queued[_Request]], now: float) -> None:
        live = []
        for queued in batch:
            request = queued.item
            if request.future.done():
                continue  # the client went away
            if request.deadline_at is not None and now > request.deadline_at:
                self.stats.expired += 1
                request.future.set_exception(DeadlineExceeded("deadline passed while queued"))
                continue
            live.append(queued)
        if not live:
            return
        self._free -= 1
        task = asyncio.create_task(self._execute(live, now))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _execute(self, batch: list[Queued[_Request]], dispatched_at: float) -> None:
        try:
            await self._run_splitting(batch, dispatched_at)
        finally:
            if self._free == 0:
                self._free_since = time.monotonic()
            self._free += 1
            self._wake.set()

    async def _run_splitting(self, batch: list[Queued[_Request]], dispatched_at: float) -> None:
        inputs = [q.item.item for q in batch]
        padded = self._padded_size(len(inputs))
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        try:
            outputs = await loop.run_in_executor(self._executor, self.runner.run, inputs, padded)
        except OutOfMemory:
            if len(batch) == 1:
                self._fail(batch, RuntimeError("a single request does not fit in memory"))
                return
            self.stats.oom_splits += 1
            half = len(batch) // 2
            self.accepted_cap = max(1, min(self.accepted_cap or half, half))
            self._apply_serving_config()
            await self._run_splitting(batch[:half], dispatched_at)
            await self._run_splitting(batch[half:], dispatched_at)
            return
        except Exception as error:  # the model failed: answer every request in the batch
            self._fail(batch, error)
            return
        self._complete(batch, outputs, padded, dispatched_at, time.monotonic() - started)

    def _complete(
        self, batch, outputs, padded: int, dispatched_at: float, execution_s: float
    ) -> None:
        s = self.stats
        s.batches += 1
        s.batch_size_sum += len(batch)
        s.padded_size_sum += padded
        s.busy_s += execution_s
        if self._padding_waste is not None:
            s.padding_waste_sum += self._padding_waste([q.item.item for q in batch])
        if self.on_batch is not None:
            self.on_batch(len(batch), self.serving_cap, execution_s)
        self._window_batches[len(batch)] = self._window_batches.get(len(batch), 0) + 1
        done_at = dispatched_at + execution_s
        self._window_latencies.extend(done_at - q.arrived_at for q in batch)
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
            self.stats.failed += 1
            if not queued.item.future.done():
                queued.item.future.set_exception(error)

    def _padded_size(self, size: int) -> int:
        bucket = bucket_for(size)
        return bucket if bucket <= max(self._warm_top, 1) else size

    # -- warm-up -------------------------------------------------------------------

    async def _warm_up(self) -> None:
        loop = asyncio.get_running_loop()
        while bucket_for(self.config.warm_target) > self._warm_top:
            bucket = max(1, self._warm_top * 2)
            seconds = await loop.run_in_executor(self._warm_executor, self.runner.warm, bucket)
            self.stats.warmup_s[bucket] = seconds
            self._warm_top = bucket
            self._apply_serving_config()

    def _apply_serving_config(self) -> None:
        self._batcher.reconfigure(BatchConfig(max(1, self.serving_cap), self.config.timeout_s))
        self._wake.set()
