"""Decision records: what the controller saw, considered, chose and why, tick by tick.

Operators read them (the API, `decisions-<policy>.jsonl` from `simulate --out`) to
answer "why did the batch cap change at 19:58?" without reading code.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any

from adaptive.config import BatchConfig
from adaptive.optimizer import Alternative
from adaptive.policy import Observation


class Mode(enum.StrEnum):
    """Who chose a tick's config: the policy (`ACTIVE`), or the controller's fallback (`FALLBACK`:
    no forecast yet, or the load has left the forecast's band for too long), which takes the more
    cautious of its own decision and the policy's."""

    ACTIVE = "active"
    FALLBACK = "fallback"


@dataclass(frozen=True, slots=True)
class ForecastUsed:
    """The part of a forecast a decision rested on (rates in requests per second)."""

    model: str
    fallback: str | None
    horizon_s: float
    mean_rps_now: float
    upper_rps_now: float
    peak_upper_rps: float
    peak_at_s: float

    def to_dict(self) -> dict[str, Any]:
        """The forecast as the decision log keeps it (JSON), rounded."""
        return {
            "model": self.model,
            "fallback": self.fallback,
            "horizon_s": round(self.horizon_s, 3),
            "mean_rps_now": round(self.mean_rps_now, 2),
            "upper_rps_now": round(self.upper_rps_now, 2),
            "peak_upper_rps": round(self.peak_upper_rps, 2),
            "peak_at_s": round(self.peak_at_s, 3),
        }


@dataclass(frozen=True, slots=True)
class ShadowDecision:
    """What a shadow policy would have run at a tick (its own guards applied) and why; never applied
    to the pool."""

    policy: str
    config: BatchConfig
    reason: str


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One control tick: inputs, forecast, previous and chosen config, alternatives, why."""

    at_s: float
    pool: str
    policy: str
    mode: Mode
    observation: Observation
    warmed_buckets: tuple[int, ...] | None
    forecast: ForecastUsed | None
    previous: BatchConfig
    proposed: BatchConfig
    chosen: BatchConfig
    reason: str
    guard: str | None
    predicted_p99_s: float | None
    planned_rate_rps: float | None
    alternatives: tuple[Alternative, ...]
    shadow: ShadowDecision | None = None
    noteworthy: bool = True  # a config or mode change, or a new shadow disagreement
    version: int = 0  # the config version the shell published it under (0: not numbered)
    replicas_before: int | None = None  # the desired replica count before this tick
    replicas: int | None = None  # ... and after it (None: a fixed fleet)
    meets_slo: bool | None = None  # some config is predicted to meet the SLO (None: no prediction)
    replanned: str | None = None  # the planner's table was rebuilt before this tick: why

    @property
    def changed(self) -> bool:
        """Whether the tick changed the config (chosen differs from previous)."""
        return self.chosen != self.previous

    @property
    def replicas_changed(self) -> bool:
        """Whether the tick changed the desired replica count."""
        return self.replicas != self.replicas_before

    @property
    def kind(self) -> str:
        """The reason in one bounded word, for metrics labels and filters."""
        if self.guard is not None and self.guard.startswith("pinned"):
            return "override"
        if self.mode is Mode.FALLBACK:
            return "fallback"
        if self.replicas_changed and not self.changed:
            return "scale_out" if self.replicas > self.replicas_before else "scale_in"
        if self.chosen != self.proposed:
            return "guarded"
        if not self.changed:
            return "hold"
        if self.chosen.max_batch_size > self.previous.max_batch_size:
            return "scale_up"
        if self.chosen.max_batch_size < self.previous.max_batch_size:
            return "scale_down"
        if self.chosen.warm_target > self.previous.warm_target:
            return "warm_ahead"
        return "retune"

    def to_dict(self) -> dict[str, Any]:
        """The record as the decision log and the API show it (JSON): configs with timeouts in ms,
        `kind`, the observation under `inputs`, the forecast, alternatives and shadow; a
        predicted p99 that is not finite is None."""
        return {
            "at_s": round(self.at_s, 6),
            "pool": self.pool,
            "policy": self.policy,
            "mode": self.mode.value,
            "previous": config_dict(self.previous),
            "proposed": config_dict(self.proposed),
            "chosen": config_dict(self.chosen),
            "version": self.version,
            "replicas": self.replicas,
            "replicas_before": self.replicas_before,
            "meets_slo": self.meets_slo,
            "replanned": self.replanned,
            "kind": self.kind,
            "reason": self.reason,
            "guard": self.guard,
            "predicted_p99_ms": None
            if self.predicted_p99_s is None or not math.isfinite(self.predicted_p99_s)
            else round(self.predicted_p99_s * 1e3, 3),
            "planned_rate_rps": None
            if self.planned_rate_rps is None
            else round(self.planned_rate_rps, 2),
            "inputs": {
                **self.observation.to_dict(),
                "warmed_buckets": None
                if self.warmed_buckets is None
                else list(self.warmed_buckets),
            },
            "forecast": None if self.forecast is None else self.forecast.to_dict(),
            "alternatives": [a.to_dict() for a in self.alternatives],
            "shadow": None
            if self.shadow is None
            else {
                "policy": self.shadow.policy,
                "config": config_dict(self.shadow.config),
                "reason": self.shadow.reason,
            },
        }


def config_dict(config: BatchConfig) -> dict[str, float]:
    """A config as records and APIs show it (timeout in ms)."""
    return {
        "max_batch": config.max_batch_size,
        "timeout_ms": round(config.timeout_s * 1e3, 3),
        "warm_max_batch": config.warm_target,
    }
