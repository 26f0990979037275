"""A Dynamo-style planner: replicas sized each interval from a load prediction and a
profile, with batching fixed. The forecast-driven baseline closest to Tidal.

Modelled on NVIDIA Dynamo's SLA planner in throughput mode (its design document,
"Scaling Algorithm", and `SLAPlannerDefaults`): every `adjustment_interval` (180 s by
default) it

1. collects the interval's request count and latency;
2. computes a correction factor, the latency measured over the interval over the latency
   the profile expected at that load (here each tick's p99 against the table's p99 for
   the fixed config at the per-replica rate, averaged over the interval);
3. predicts the next interval's request count with its load predictor (`constant`,
   `arima` or `kalman`: `forecaster.interval_predictors`);
4. sizes the fleet as Dynamo sizes its single-batch (prefill) engines:
   `ceil(next_count / interval * min(1, correction) / throughput_per_replica)`, where the
   throughput per replica is the highest rate at which the profile predicts the fixed
   config to meet the SLO (Dynamo's interpolated throughput at its TTFT target);
5. scales to that count at once, without waiting for earlier moves to finish (Dynamo
   scales non-blockingly), never below one replica (`min_endpoint`).

Dynamo's faster load-based loop (`enable_load_scaling`) is off by default there and is
not modelled here; neither is Prophet. Batching stays at the one config it was given,
as Dynamo leaves the engine's own batching alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from adaptive.config import BatchConfig
from adaptive.optimizer import ConfigOptimizer
from adaptive.policy import Decision, Snapshot
from forecaster.interval_predictors import IntervalPredictor
from tidal_base.errors import InvalidInput

DYNAMO_INTERVAL_S = 180.0
"""Dynamo's default `adjustment_interval`, in seconds."""


@dataclass
class DynamoPlannerPolicy:
    """Replicas every `interval_s` from a load predictor and a one-replica profile, over a
    static batch config."""

    config: BatchConfig
    optimizer: ConfigOptimizer  # its table for one replica
    predictor: IntervalPredictor
    interval_s: float = DYNAMO_INTERVAL_S
    spec_text: str = "dynamo-planner"
    _started: float | None = field(default=None, init=False)
    _count: float = field(default=0.0, init=False)  # requests this interval
    _ratios: list[float] = field(default_factory=list, init=False)  # measured/expected p99
    _replicas: int | None = field(default=None, init=False)
    _why: str = field(default="waiting for the first interval", init=False)

    def __post_init__(self) -> None:
        if not 0 < self.interval_s < math.inf:
            raise InvalidInput(f"interval must be a finite duration > 0, got {self.interval_s}")
        self.replica_rps = throughput_per_replica(self.optimizer, self.config)
        if self.replica_rps <= 0:
            raise InvalidInput(
                f"{self.config.describe()} is not predicted to meet the SLO on one replica "
                "at any rate of the profile"
            )

    @property
    def spec(self) -> str:
        """The spec as written (`spec_text`), which rebuilds it."""
        return self.spec_text

    def initial_config(self) -> BatchConfig:
        """The static batch config, held throughout."""
        return self.config

    def decide(self, snapshot: Snapshot) -> Decision:
        """The static config, and (when the fleet scales) the replicas of the last
        interval's plan: until the first interval has passed, the replicas desired now.
        With a fixed fleet, no replica count."""
        fleet = snapshot.fleet
        if fleet is None:
            return Decision(self.config, "static batching; the fleet is fixed")
        if self._started is None:
            self._started = snapshot.now - snapshot.tick_s
        self._measure(snapshot, max(1, fleet.ready))
        if snapshot.now - self._started + 1e-9 >= self.interval_s:
            self._plan(snapshot.now)
        replicas = fleet.desired if self._replicas is None else self._replicas
        return Decision(self.config, self._why, replicas=replicas)

    def _measure(self, snapshot: Snapshot, ready: int) -> None:
        observation = snapshot.observation
        rate_rps = observation.arrival_rate_rps
        self._count += rate_rps * snapshot.tick_s
        if observation.latency_p99_s is not None and rate_rps > 0:
            expected = self.optimizer.predicted_p99_s(self.config, rate_rps / ready)
            if 0 < expected < math.inf:
                self._ratios.append(observation.latency_p99_s / expected)

    def _plan(self, now: float) -> None:
        interval_s = now - self._started
        self.predictor.observe(self._count)
        correction = float(np.mean(self._ratios)) if self._ratios else 1.0
        predicted = self.predictor.predict()
        load_rps = predicted / interval_s * min(1.0, correction)
        self._replicas = max(1, math.ceil(load_rps / self.replica_rps - 1e-9))
        self._why = (
            f"{self.predictor.name} predicts {predicted / interval_s:.0f} req/s over the next "
            f"{interval_s:g} s (correction {correction:.2f}); at {self.replica_rps:.0f} req/s "
            f"a replica: {self._replicas} replicas"
        )
        self._started, self._count, self._ratios = now, 0.0, []


def throughput_per_replica(optimizer: ConfigOptimizer, config: BatchConfig) -> float:
    """The highest rate of the profile's grid at which `config` is predicted to hold the
    SLO's p99 on one replica (0 when at none)."""
    rates = optimizer.table.rates_rps
    ok = [r for r in rates if optimizer.predicted_p99_s(config, float(r)) <= optimizer.slo_s]
    return float(max(ok)) if ok else 0.0
