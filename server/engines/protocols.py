"""The engine seam: what the control plane needs of whatever serves a pool's batches.

Two things: put a config in force (and say what a change costs), and report what was
served per window. Tidal's worker, a Ray Serve replica and a Triton model each implement
`Engine`; `server.engines.member.PoolMember` carries any of them over the bus, so the
controller, its policies, guardrails, API and metrics see one kind of pool member.
"""

from __future__ import annotations

from typing import Any, Protocol

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.change_cost import ChangeCost
from tidal_base.errors import TidalError


class ConfigRejected(TidalError):
    """The engine refused a config (a cap the deployment cannot take, an override the
    server answered with an error); the config it ran before keeps serving."""


class Engine(Protocol):
    """One engine a pool member steers.

    kind: what it is, as the API shows it ("tidal-worker", "ray-serve", "triton").
    change_cost: what putting a new config in force costs it.
    version: the config version in force (0 before any was applied).
    """

    kind: str
    change_cost: ChangeCost

    @property
    def version(self) -> int:
        """The config version in force (0 before any was applied)."""
        ...

    async def apply(self, published: VersionedConfig) -> None:
        """Put `published` in force, returning once it serves (a Triton reload takes
        seconds; a setter, microseconds). Raises `ConfigRejected` when the engine refuses
        it, with the old config still serving; any other exception is a failure of the
        engine or of the adapter, which the member logs, counts and retries."""
        ...

    async def collect(self) -> WorkerStats:
        """What was served since the last call (the first: since the engine started),
        with `window_s` measured on the engine's clock; never blocks for long."""
        ...

    def status(self) -> dict[str, Any]:
        """Levels the pool's API shows with the heartbeat: at least `queue_depth`,
        `serving_max_batch` and `warmed_buckets` (a list, or None if not modelled);
        optionally `ready` (False while the engine cannot take its share of traffic)
        and `not_ready` (why). Without `ready` the member counts as ready."""
        ...
