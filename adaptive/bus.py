"""The bus seam: how pool statistics reach the controller and configs reach workers.

The controller and the workers never call each other; they publish and read through a
`Bus`. In-process (the simulator, one-machine runs, tests) that is `InMemoryBus`; across
machines it is Redis (`server/`). Configs carry a version that only grows, so a worker
can ignore anything older than what it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from adaptive.config import BatchConfig
from adaptive.policy import Observation
from adaptive.warmup import WarmupStatus


@dataclass(frozen=True, slots=True)
class VersionedConfig:
    version: int
    config: BatchConfig


@dataclass(frozen=True, slots=True)
class PoolStats:
    """What a pool's workers report for one control tick."""

    observation: Observation
    warmup: WarmupStatus | None = None
    config_version: int = 0


class Bus(Protocol):
    def publish_config(self, pool: str, config: VersionedConfig) -> None: ...

    def current_config(self, pool: str) -> VersionedConfig | None: ...

    def publish_stats(self, pool: str, stats: PoolStats) -> None: ...

    def take_stats(self, pool: str) -> PoolStats | None:
        """The latest stats since the last take, or None if none arrived."""
        ...


class InMemoryBus:
    """A bus inside one process."""

    def __init__(self) -> None:
        self._configs: dict[str, VersionedConfig] = {}
        self._stats: dict[str, PoolStats] = {}

    def publish_config(self, pool: str, config: VersionedConfig) -> None:
        held = self._configs.get(pool)
        if held is None or config.version > held.version:
            self._configs[pool] = config

    def current_config(self, pool: str) -> VersionedConfig | None:
        return self._configs.get(pool)

    def publish_stats(self, pool: str, stats: PoolStats) -> None:
        self._stats[pool] = stats

    def take_stats(self, pool: str) -> PoolStats | None:
        return self._stats.pop(pool, None)
