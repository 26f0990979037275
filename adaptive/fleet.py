"""The fleet's size as a decision: how many replicas a pool should have, within limits.

A policy that plans capacity answers with a desired replica count beside its batch
config (`Decision.replicas`); the controller keeps it within `FleetLimits` and records
why it changed. What the policy sees of the fleet is a `FleetView`: the replicas ready
to serve, those still starting, and the count last asked for. A fixed fleet (no limits)
has no view, and nothing about replicas changes anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal_base.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class FleetLimits:
    """Bounds on the replica count, and how long a new replica takes to start (until it
    can load the model and warm; warm-up is paid after it, per bucket, as today)."""

    min_replicas: int
    max_replicas: int
    startup_s: float = 0.0

    def __post_init__(self) -> None:
        if self.min_replicas < 1:
            raise InvalidInput(f"min replicas must be >= 1, got {self.min_replicas}")
        if self.max_replicas < self.min_replicas:
            raise InvalidInput(
                f"max replicas ({self.max_replicas}) must be >= min replicas ({self.min_replicas})"
            )
        if not 0 <= self.startup_s < float("inf"):
            raise InvalidInput(
                f"replica start-up must be a finite duration >= 0, got {self.startup_s}"
            )

    def clamp(self, replicas: int) -> int:
        """`replicas` within [min_replicas, max_replicas]."""
        return min(self.max_replicas, max(self.min_replicas, replicas))


@dataclass(frozen=True, slots=True)
class FleetView:
    """The fleet at one tick: `ready` replicas serve, `starting` ones are on their way
    (asked for, not yet serving), `desired` is the count last asked for (ready +
    starting, once every replica asked for has been given)."""

    ready: int
    starting: int
    desired: int
    startup_s: float = 0.0

    @property
    def provisioned(self) -> int:
        """Replicas paid for now: ready or starting."""
        return self.ready + self.starting
