"""Whether a worker can take its share of traffic: one answer for its `/readyz` and for
the heartbeat its pool's controller counts (`workers_ready`), so the two never disagree."""

from __future__ import annotations

from typing import Protocol

from server.worker.batching import DynamicBatcher


class Frontends(Protocol):
    """The worker's front-end processes (`server.worker.frontends.FrontendPool`)."""

    count: int

    @property
    def ready(self) -> bool:
        """Every front end is connected to the model process."""
        ...

    def summary(self) -> list[dict]:
        """One entry per front end, each with a boolean `connected`."""
        ...


def not_ready(batcher: DynamicBatcher, frontends: Frontends | None = None) -> str | None:
    """Why the worker cannot take its share of traffic, or None when it can: its
    dispatch loop died, its starting config's sizes are still warming (it would serve at
    a partial cap), or its front ends are not all connected (requests would be refused)."""
    if not batcher.ready:
        return f"the dispatch loop died ({batcher.failure!r})"
    if not batcher.warmed_up:
        warm = ", ".join(map(str, batcher.warmed_buckets)) or "none"
        return f"warming up (batch sizes warm so far: {warm}; serving cap {batcher.serving_cap})"
    if frontends is not None and not frontends.ready:
        connected = sum(bool(f["connected"]) for f in frontends.summary())
        return f"front ends starting ({connected} of {frontends.count} connected)"
    return None
