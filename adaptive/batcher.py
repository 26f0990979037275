"""The dynamic-batching state machine: one FIFO queue and its dispatch rule.

This is the single definition of Tidal's batching semantics (docs/batching.md) in the
form a live worker runs it: requests are offered one at a time, and a free worker asks
for a batch. The batcher never reads a clock or waits; it says when the next batch is
due (`next_deadline`) and the shell decides how to wait for it. The simulator's compiled
engine implements the same rule batch-at-a-time, and a parity test holds them equal.

Rule: a free worker takes up to `max_batch_size` queued requests as soon as that many
are queued, or as soon as the oldest queued request has waited `timeout_s`, whichever
comes first. A new config applies from the next batch formation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from adaptive.config import BatchConfig
from tidal_base.errors import InvalidInput

Item = TypeVar("Item")


@dataclass(frozen=True, slots=True)
class Queued(Generic[Item]):
    """A request waiting in the queue, with the time it arrived."""

    item: Item
    arrived_at: float


class Batcher(Generic[Item]):
    """FIFO queue plus dispatch rule; optionally bounded (arrivals past the bound are shed)."""

    def __init__(self, config: BatchConfig, max_queue: int | None = None) -> None:
        if max_queue is not None and max_queue < 1:
            raise InvalidInput(f"max_queue must be >= 1, got {max_queue}")
        self._config = config
        self._max_queue = max_queue
        self._queue: deque[Queued[Item]] = deque()

    @property
    def config(self) -> BatchConfig:
        return self._config

    def __len__(self) -> int:
        return len(self._queue)

    def offer(self, item: Item, now: float) -> bool:
        """Queue a request that arrived at `now`; False if the queue is full (shed)."""
        if self._max_queue is not None and len(self._queue) >= self._max_queue:
            return False
        self._queue.append(Queued(item, now))
        return True

    def next_deadline(self) -> float | None:
        """When a free worker may take the next batch (possibly in the past); None if empty."""
        if not self._queue:
            return None
        if len(self._queue) >= self._config.max_batch_size:
            return self._queue[self._config.max_batch_size - 1].arrived_at
        return self._queue[0].arrived_at + self._config.timeout_s

    def take_nowait(self, now: float) -> list[Queued[Item]] | None:
        """The batch a free worker dispatches at `now`, or None if none is due yet."""
        deadline = self.next_deadline()
        if deadline is None or now < deadline:
            return None
        size = min(self._config.max_batch_size, len(self._queue))
        return [self._queue.popleft() for _ in range(size)]

    def reconfigure(self, config: BatchConfig) -> None:
        """Apply a new config from the next batch formation; the queue is untouched."""
        self._config = config

    def drain(self) -> list[Queued[Item]]:
        """Everything queued, oldest first, leaving the queue empty (shutdown)."""
        drained = list(self._queue)
        self._queue.clear()
        return drained
