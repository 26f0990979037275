"""Batching by group: one batching queue per group key, for variable-length inputs.

A transformer batch is padded to its longest sequence, so a batch mixing 10-token and
120-token requests wastes most of its compute on padding. `GroupedBatcher` keeps one
`Batcher` per group (a length bucket, say) and applies the batching rule to each group
on its own: a free worker takes the group whose batch is due first (ties: the smallest
key). Order is FIFO within a group; across groups a later short request may leave before
an earlier long one. The queue bound counts every group together. Deadlines expire in
each group as in `Batcher`; `next_expiry` and `expire` span every group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from adaptive.batcher import Batcher, Queued
from adaptive.config import BatchConfig
from tidal_base.errors import InvalidInput

Item = TypeVar("Item")


class GroupedBatcher(Generic[Item]):
    """The `Batcher` interface over one queue per `key(item)`."""

    def __init__(
        self, config: BatchConfig, key: Callable[[Item], int], max_queue: int | None = None
    ) -> None:
        """`config`: every group's rule until `reconfigure`. `key`: a request's group (its length
        bucket, say). `max_queue`: how many requests may wait across all groups (None: no
        bound); `InvalidInput` if below 1."""
        if max_queue is not None and max_queue < 1:
            raise InvalidInput(f"max_queue must be >= 1, got {max_queue}")
        self._config = config
        self._key = key
        self._max_queue = max_queue
        self._groups: dict[int, Batcher[Item]] = {}
        self._size = 0

    @property
    def config(self) -> BatchConfig:
        """The config the next batch of any group forms under."""
        return self._config

    def __len__(self) -> int:
        return self._size

    def offer(self, item: Item, now: float, deadline_at: float | None = None) -> bool:
        """Queue a request that arrived at `now` in its group, to expire at `deadline_at` if it
        is still waiting then; False if the queue (all groups together) is full (shed)."""
        if self._max_queue is not None and self._size >= self._max_queue:
            return False
        key = self._key(item)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Batcher(self._config)
        group.offer(item, now, deadline_at)
        self._size += 1
        return True

    def next_deadline(self) -> float | None:
        """The soonest instant any group's batch is due (possibly in the past); None if empty."""
        deadlines = [d for d in (g.next_deadline() for g in self._groups.values()) if d is not None]
        return min(deadlines, default=None)

    def next_expiry(self) -> float | None:
        """When the soonest deadline of a waiting request in any group passes; None if
        none has one."""
        expiries = [e for e in (g.next_expiry() for g in self._groups.values()) if e is not None]
        return min(expiries, default=None)

    def expire(self, now: float) -> list[Queued[Item]]:
        """Remove and return every waiting request, in any group, whose deadline is at or before
        `now`, soonest deadline first (ties: earliest arrival)."""
        expired = [q for group in self._groups.values() for q in group.expire(now)]
        self._size -= len(expired)
        return sorted(expired, key=lambda q: (q.deadline_at, q.arrived_at))

    def take_nowait(self, now: float) -> list[Queued[Item]] | None:
        """The batch of the group due first at `now` (ties: the smallest key), or None if no
        group's batch is due yet. A batch never mixes groups."""
        due = [
            (deadline, key)
            for key, group in self._groups.items()
            if (deadline := group.next_deadline()) is not None and deadline <= now
        ]
        if not due:
            return None
        batch = self._groups[min(due)[1]].take_nowait(now)
        self._size -= len(batch)
        return batch

    def reconfigure(self, config: BatchConfig) -> None:
        """Apply a new config to every group from its next batch formation; queues are untouched."""
        self._config = config
        for group in self._groups.values():
            group.reconfigure(config)

    def drain(self) -> list[Queued[Item]]:
        """Everything waiting in every group, oldest arrival first, leaving them all empty."""
        drained = sorted(
            (q for g in self._groups.values() for q in g.drain()), key=lambda q: q.arrived_at
        )
        self._size = 0
        return drained
