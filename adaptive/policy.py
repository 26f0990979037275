"""The policy seam: what a policy sees each control tick, and what it answers.

A policy is pure over the snapshots it is given (state is allowed only as a
deterministic function of the snapshots seen), so the simulator and the live control
plane get the same decisions from the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from adaptive.config import BatchConfig


@dataclass(frozen=True, slots=True)
class Observation:
    """What the workers of a pool did over one window that ended at `ended_at`."""

    ended_at: float
    window_s: float
    arrivals: int
    completed: int
    shed: int
    queue_depth: int
    latency_p50_s: float | None
    latency_p99_s: float | None
    mean_batch_size: float | None
    batch_fill_ratio: float | None
    utilization: float

    @property
    def arrival_rate_rps(self) -> float:
        return self.arrivals / self.window_s


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a policy may base one decision on."""

    now: float
    observation: Observation
    config: BatchConfig
    slo_s: float
    workers: int
    warmed_buckets: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer: the config to run, and a sentence a person can read about why."""

    config: BatchConfig
    reason: str


class Policy(Protocol):
    """Chooses the batch config at each control tick."""

    @property
    def spec(self) -> str:
        """The spec string that rebuilds this policy, e.g. "static:max_batch=32,timeout=10ms"."""
        ...

    def initial_config(self) -> BatchConfig:
        """The config to start with, before any observation."""
        ...

    def decide(self, snapshot: Snapshot) -> Decision: ...


@dataclass(frozen=True, slots=True)
class StaticPolicy:
    """One fixed config, as Triton, TorchServe and Ray Serve run by default."""

    config: BatchConfig

    @property
    def spec(self) -> str:
        return f"static:{self.config.describe()}"

    def initial_config(self) -> BatchConfig:
        return self.config

    def decide(self, snapshot: Snapshot) -> Decision:
        return Decision(self.config, "static config")
