"""The dynamic-batching state machine: one FIFO queue and its dispatch rule.

This is the single definition of Tidal's batching semantics (docs/batching.md) in the
form a live worker runs it: requests are offered one at a time, and a free worker asks
for a batch. The batcher never reads a clock or waits; it says when the next batch is
due (`next_deadline`) and when the next queued request's own deadline passes
(`next_expiry`), and the shell decides how to wait for them. The simulator's compiled
engine implements the same rule batch-at-a-time, and a parity test holds them equal.

Rule: a free worker takes up to `max_batch_size` queued requests as soon as that many
are queued, or as soon as the oldest queued request has waited `timeout_s`, whichever
comes first. A new config applies from the next batch formation. A request offered with
a deadline leaves the queue unserved at that instant (`expire`), and from then on the
rule counts only the requests still waiting: the timeout runs from the oldest of them.
Without deadlines (the simulator has none) nothing expires and the rule is unchanged.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from adaptive.config import BatchConfig
from tidal_base.errors import InvalidInput

Item = TypeVar("Item")


@dataclass(frozen=True, slots=True)
class Queued(Generic[Item]):
    """A request waiting in the queue: when it arrived and, if it has one, when it
    stops waiting (`deadline_at`, an instant on the same clock)."""

    item: Item
    arrived_at: float
    deadline_at: float | None = None


class Batcher(Generic[Item]):
    """FIFO queue plus dispatch rule; optionally bounded (arrivals past the bound are shed).

    Each request holds a ticket (its place in arrival order). A request that expires
    from the middle of the queue is left there as a tombstone, skipped by the rule and
    by `take_nowait`, so expiring never costs a scan of the queue; tombstones at the
    head are dropped at once (the head is always a waiting request), and the queue is
    compacted when they are most of it.
    """

    def __init__(self, config: BatchConfig, max_queue: int | None = None) -> None:
        """`config`: the rule batches form under until `reconfigure`. `max_queue`: how many
        requests may wait at once (None: no bound); `InvalidInput` if below 1."""
        if max_queue is not None and max_queue < 1:
            raise InvalidInput(f"max_queue must be >= 1, got {max_queue}")
        self._config = config
        self._max_queue = max_queue
        self._queue: deque[tuple[int, Queued[Item]]] = deque()  # (ticket, request), FIFO
        self._tickets = itertools.count()
        self._expired: set[int] = set()  # tombstones: tickets expired, still in _queue
        self._with_deadline: dict[int, Queued[Item]] = {}  # waiting requests with one
        self._expiries: list[tuple[float, int]] = []  # heap of (deadline_at, ticket)

    @property
    def config(self) -> BatchConfig:
        """The config the next batch forms under."""
        return self._config

    def __len__(self) -> int:
        """Requests waiting (expired ones are gone)."""
        return len(self._queue) - len(self._expired)

    def offer(self, item: Item, now: float, deadline_at: float | None = None) -> bool:
        """Queue a request that arrived at `now`, to expire at `deadline_at` if it is
        still waiting then; False if the queue is full (shed)."""
        if self._max_queue is not None and len(self) >= self._max_queue:
            return False
        ticket = next(self._tickets)
        queued = Queued(item, now, deadline_at)
        self._queue.append((ticket, queued))
        if deadline_at is not None:
            self._with_deadline[ticket] = queued
            heapq.heappush(self._expiries, (deadline_at, ticket))
        return True

    def next_deadline(self) -> float | None:
        """When a free worker may take the next batch (possibly in the past); None if empty."""
        if not len(self):
            return None
        if len(self) >= self._config.max_batch_size:
            return self._nth_waiting(self._config.max_batch_size - 1).arrived_at
        return self._queue[0][1].arrived_at + self._config.timeout_s

    def next_expiry(self) -> float | None:
        """When the soonest deadline of a waiting request passes; None if none has one."""
        # Entries of requests already taken are dropped lazily, here and in `expire`.
        while self._expiries and self._expiries[0][1] not in self._with_deadline:
            heapq.heappop(self._expiries)
        return self._expiries[0][0] if self._expiries else None

    def expire(self, now: float) -> list[Queued[Item]]:
        """Remove and return every waiting request whose deadline is at or before `now`,
        soonest deadline first. A shell calls it before `take_nowait(now)`, so a request
        is never taken at or after its deadline."""
        expired = []
        while self._expiries and self._expiries[0][0] <= now:
            _, ticket = heapq.heappop(self._expiries)
            queued = self._with_deadline.pop(ticket, None)
            if queued is not None:
                self._expired.add(ticket)
                expired.append(queued)
        if expired:
            self._drop_tombstones()
        return expired

    def take_nowait(self, now: float) -> list[Queued[Item]] | None:
        """The batch a free worker dispatches at `now`, or None if none is due yet."""
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return None
        batch = []
        while len(batch) < self._config.max_batch_size and self._queue:
            ticket, queued = self._queue.popleft()
            if ticket in self._expired:
                self._expired.discard(ticket)
                continue
            if queued.deadline_at is not None:
                del self._with_deadline[ticket]
            batch.append(queued)
        self._drop_tombstones()
        if len(self._expiries) > 2 * len(self._with_deadline) + 64:
            self._expiries = [(q.deadline_at, t) for t, q in self._with_deadline.items()]
            heapq.heapify(self._expiries)  # taken requests' entries would pile up
        return batch

    def reconfigure(self, config: BatchConfig) -> None:
        """Apply a new config from the next batch formation; the queue is untouched."""
        self._config = config

    def drain(self) -> list[Queued[Item]]:
        """Everything waiting, oldest first, leaving the queue empty (shutdown)."""
        drained = [q for t, q in self._queue if t not in self._expired]
        self._queue.clear()
        self._expired.clear()
        self._with_deadline.clear()
        self._expiries.clear()
        return drained

    def _nth_waiting(self, n: int) -> Queued[Item]:
        """The n-th (from 0) waiting request in arrival order."""
        if not self._expired:
            return self._queue[n][1]
        waiting = (q for t, q in self._queue if t not in self._expired)
        return next(itertools.islice(waiting, n, None))

    def _drop_tombstones(self) -> None:
        """Keep a waiting request at the head; compact when tombstones are most of the
        queue, so a queue of mixed deadlines does not grow without bound."""
        while self._queue and self._queue[0][0] in self._expired:
            self._expired.discard(self._queue.popleft()[0])
        if len(self._expired) > len(self._queue) // 2:
            self._queue = deque(e for e in self._queue if e[0] not in self._expired)
            self._expired.clear()
