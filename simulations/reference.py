"""A plain event-driven replay built on the live batcher, to hold the fast engine honest.

This drives `adaptive.batcher.Batcher` exactly as a live worker shell does (offer each
arrival, let each free worker `take_nowait`, sleep until the next deadline, arrival or
completion) under a manual clock. It is slow and obvious on purpose: the parity tests run
it against the compiled kernel on the same arrivals and require identical batches and
dispatch times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from adaptive.batcher import Batcher
from adaptive.config import BatchConfig
from simulations.engine import Routing


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request; dispatched_at is None when it was shed."""

    request_id: int
    arrived_at: float
    dispatched_at: float | None
    completed_at: float | None
    worker: int
    batch: int


ServiceTime = Callable[[int, int], float]
"""(batch size, batch index) -> service seconds."""


class _Replay:
    def __init__(self, workers: int, routing: Routing, max_queue: int | None) -> None:
        queues = 1 if routing is Routing.SHARED else workers
        self.routing = routing
        self.batchers = [Batcher(BatchConfig(1, 0.0), max_queue) for _ in range(queues)]
        self.free_at = [0.0] * workers
        self.records: list[RequestRecord] = []
        self.round_robin = 0
        self.batches = 0

    def reconfigure(self, config: BatchConfig) -> None:
        for batcher in self.batchers:
            batcher.reconfigure(config)

    def offer(self, request_id: int, now: float) -> None:
        queue = self._route(now)
        if not self.batchers[queue].offer(request_id, now):
            self.records.append(RequestRecord(request_id, now, None, None, -1, -1))

    def _route(self, now: float) -> int:
        if self.routing is Routing.SHARED:
            return 0
        if self.routing is Routing.ROUND_ROBIN:
            self.round_robin += 1
            return (self.round_robin - 1) % len(self.batchers)
        loads = [len(b) + (self.free_at[q] > now) for q, b in enumerate(self.batchers)]
        return loads.index(min(loads))

    def _workers_of(self, queue: int) -> list[int]:
        return list(range(len(self.free_at))) if self.routing is Routing.SHARED else [queue]

    def dispatch_due(self, now: float, service_s: ServiceTime) -> None:
        """Every free worker takes every batch due at `now`, earliest-free worker first."""
        progress = True
        while progress:
            progress = False
            for queue, batcher in enumerate(self.batchers):
                free = [w for w in self._workers_of(queue) if self.free_at[w] <= now]
                if not free:
                    continue
                batch = batcher.take_nowait(now)
                if batch is None:
                    continue
                worker = min(free, key=lambda w: (self.free_at[w], w))
                done = now + service_s(len(batch), self.batches)
                self.free_at[worker] = done
                self.records.extend(
                    RequestRecord(q.item, q.arrived_at, now, done, worker, self.batches)
                    for q in batch
                )
                self.batches += 1
                progress = True

    def next_wakeup(self, now: float) -> float:
        """The next instant at which a worker could take a batch without a new arrival."""
        wake = math.inf
        for queue, batcher in enumerate(self.batchers):
            deadline = batcher.next_deadline()
            if deadline is None:
                continue
            free_at = min(self.free_at[w] for w in self._workers_of(queue))
            wake = min(wake, max(deadline, free_at, now))
        return wake


def replay_reference(
    arrivals: Sequence[float],
    config_for_tick: Callable[[int], BatchConfig],
    tick_s: float,
    workers: int,
    service_s: ServiceTime,
    routing: Routing = Routing.SHARED,
    max_queue: int | None = None,
) -> list[RequestRecord]:
    """Replay sorted `arrivals`; the config of tick k applies from k * tick_s."""
    replay = _Replay(workers, routing, max_queue)
    tick = 0
    replay.reconfigure(config_for_tick(0))
    i, now = 0, 0.0
    while True:
        next_arrival = arrivals[i] if i < len(arrivals) else math.inf
        boundary = (tick + 1) * tick_s
        wake = replay.next_wakeup(now)
        now = min(next_arrival, wake, boundary)
        if now == math.inf or (i >= len(arrivals) and wake == math.inf):
            return replay.records
        if now == boundary:
            tick += 1
            replay.reconfigure(config_for_tick(tick))
        while i < len(arrivals) and arrivals[i] <= now:
            replay.offer(i, arrivals[i])
            i += 1
        replay.dispatch_due(now, service_s)
