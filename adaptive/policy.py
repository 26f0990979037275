"""The policy seam: what a policy sees each control tick, and what it answers.

A policy is pure over the snapshots it is given (state is allowed only as a
deterministic function of the snapshots seen), so the simulator and the live control
plane get the same decisions from the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from adaptive.config import BatchConfig
from adaptive.optimizer import Alternative, ConfigOptimizer

if TYPE_CHECKING:
    from adaptive.fleet import FleetView
    from forecaster.forecast import Forecast
    from forecaster.models import Forecaster


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
    batches: int = 0
    busy_s: float = 0.0
    rate_rps: float | None = None  # normalised by the worker-seconds reported (observe_pool)

    @property
    def arrival_rate_rps(self) -> float:
        """The pool's arrival rate, requests per second: `rate_rps` where the shell
        normalised it by the worker-seconds reported (`observe_pool`), else the window's
        arrivals over its length."""
        return self.arrivals / self.window_s if self.rate_rps is None else self.rate_rps

    def to_dict(self) -> dict[str, object]:
        """The observation as the decision log keeps it (JSON): rate (rps), queue depth,
        p50 and p99 (ms; None when nothing completed), mean batch size, fill ratio,
        utilisation and requests shed."""
        return {
            "rate_rps": round(self.arrival_rate_rps, 3),
            "queue_depth": self.queue_depth,
            "p50_ms": _ms(self.latency_p50_s),
            "p99_ms": _ms(self.latency_p99_s),
            "mean_batch_size": None
            if self.mean_batch_size is None
            else round(self.mean_batch_size, 3),
            "batch_fill_ratio": None
            if self.batch_fill_ratio is None
            else round(self.batch_fill_ratio, 4),
            "utilization": round(self.utilization, 4),
            "shed": self.shed,
        }


def _ms(value_s: float | None) -> float | None:
    return None if value_s is None else round(value_s * 1e3, 3)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything a policy may base one decision on."""

    now: float
    observation: Observation
    config: BatchConfig
    slo_s: float
    workers: int
    warmed_buckets: tuple[int, ...] | None = None  # None: warm-up not modelled; (): none warm
    warmup_s: float = 0.0
    tick_s: float = 1.0
    forecast: Forecast | None = None
    reload_s: float = 0.0  # an engine that reloads for any change (Triton): its cost
    fleet: FleetView | None = None  # None: a fixed fleet of `workers`

    @property
    def warm_cap(self) -> int:
        """The largest batch the workers can serve now without warming anything: any
        batch when warm-up is not modelled, one request at a time when nothing is warm."""
        if self.warmed_buckets is None:
            return self.config.max_batch_size
        return self.warmed_buckets[-1] if self.warmed_buckets else 1

    @property
    def serving_cap(self) -> int:
        """The cap in force: the one asked for, as far as warmed buckets allow."""
        return min(self.config.max_batch_size, self.warm_cap)


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer: the config to run, and a sentence a person can read about why.

    Policies that predict say what they expect (`predicted_p99_s`), for which load
    (`planned_rate_rps`), and what else they weighed (`alternatives`). A policy that
    cuts its cap because latency already missed marks the move `protective`. A policy
    that plans capacity says how many replicas the pool should have (`replicas`), and
    its reason says why. A policy that predicts says whether any config is predicted to
    meet the SLO at the load it plans for (`meets_slo`; None: it does not predict).
    """

    config: BatchConfig
    reason: str
    predicted_p99_s: float | None = None
    planned_rate_rps: float | None = None
    alternatives: tuple[Alternative, ...] = ()
    protective: bool = False  # a move made to protect latency: guards apply it at once
    replicas: int | None = None  # the replica count to have; None: no opinion (or fixed)
    meets_slo: bool | None = None


class Policy(Protocol):
    """Chooses the batch config at each control tick."""

    @property
    def spec(self) -> str:
        """The spec string that rebuilds this policy, e.g. "static:max_batch=32,timeout=10ms"."""
        ...

    def initial_config(self) -> BatchConfig:
        """The config to start with, before any observation."""
        ...

    def decide(self, snapshot: Snapshot) -> Decision:
        """The config for the next tick. Deterministic in the snapshots seen so far
        (state only as a function of them), no clock, no I/O, no randomness: the
        simulator and the live loop get the same answers from the same snapshots. The
        guardrails apply afterwards; a move made to protect latency says `protective`."""
        ...


@runtime_checkable
class ForecastingPolicy(Policy, Protocol):
    """A policy that needs a forecast of the load in its snapshots."""

    forecaster: Forecaster
    forecast_step_s: float
    uses_events: bool  # False for a forecaster that already knows them (the oracle)
    history_s: float  # how much history the forecaster is refitted on

    def horizon_s(self, warmup_s: float, tick_s: float, reload_s: float = 0.0) -> float:
        """How far ahead the forecast must reach, given what a change costs (warm-up
        per bucket, reload per change) and the tick."""
        ...


@runtime_checkable
class PlanningPolicy(Policy, Protocol):
    """A policy that plans with an optimiser's table (`adaptive.optimizer`): the shell may
    hand it one rebuilt for a newer latency model between steps."""

    @property
    def optimizer(self) -> ConfigOptimizer:
        """The optimiser the policy plans with now."""
        ...

    def replan(self, optimizer: ConfigOptimizer) -> None:
        """Plan with `optimizer` from the next step on; it has the SLO, margin and pool
        size of the one it replaces. What the policy learnt of the load is kept."""
        ...


@dataclass(frozen=True, slots=True)
class StaticPolicy:
    """One fixed config, as Triton, TorchServe and Ray Serve run by default."""

    config: BatchConfig

    @property
    def spec(self) -> str:
        """The spec "static:max_batch=N,timeout=T", with `warm=N` when set."""
        return f"static:{self.config.describe()}"

    def initial_config(self) -> BatchConfig:
        """`config`, the one config it ever runs."""
        return self.config

    def decide(self, snapshot: Snapshot) -> Decision:
        """`config`, whatever the snapshot says."""
        return Decision(self.config, "static config")
