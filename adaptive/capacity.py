"""Replicas and batches planned together: the joint policy (`predictive:replicas=plan`).

A replica's capacity depends on its batch config, and while new replicas start, the
ones already up can only bridge the gap by batching more. So one policy decides both:

- Batches: the planning policy (`predictive`, or the oracle) runs on a per-replica view
  of the pool (its rates and forecast divided by the replicas ready now) with an
  optimiser compiled for one replica. While replicas start, the ready ones see a larger
  share and batch more: the bridge.
- Replicas: enough that each gets at most `headroom` of what one replica can serve
  within the SLO at its best config, for the forecast's upper bound over the time a new
  replica takes to serve (start-up, warm-up of every bucket, a forecast step and two
  ticks): scale out ahead. The load measured now is a floor, so a forecast that misses
  still scales out (reactively), in fallback too.
- Scale in only on measured load (AWS predictive scaling's rule): only when the highest
  load measured over `scale_in_after_s` needs fewer replicas, and the forecast has not
  asked for more over that window either. A forecast alone never removes a replica.
- With a `risk` budget (> 0), the forecast's upper bound sizes the fleet only where it
  matters: when the forecast touches a declared event, when it comes from a fallback,
  or when the load measured has outrun the forecast's sizing within `scale_in_after_s`.
  Elsewhere the fleet is sized for the forecast's quantile 1 - `risk` over the lead
  (chance-constrained: the band read as normal around its mean), so the predicted
  chance that the load over the start-up time needs more replicas stays under `risk`
  at each step. The reason names the rule that sized the fleet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np

from adaptive.config import BatchConfig
from adaptive.fleet import FleetView
from adaptive.optimizer import ConfigOptimizer
from adaptive.policy import Decision, Snapshot
from adaptive.predictive import PredictivePolicy
from adaptive.sliding import SlidingMax
from adaptive.warmup import warm_time_s
from forecaster.forecast import Forecast
from forecaster.models import Forecaster
from tidal_base.errors import InvalidInput
from tidal_base.values import evolve


@dataclass
class JointPolicy:
    """A planning policy for batches, sized per replica, and the replica count beside it."""

    batching: PredictivePolicy  # its optimiser compiled for one replica
    startup_s: float
    headroom: float = 0.8
    scale_in_after_s: float = 600.0
    risk: float = 0.0  # 0: always the band's upper bound
    spec_text: str = "predictive:replicas=plan"
    # The load measured, and the replicas wanted, over the scale-in window.
    _peak_rps: SlidingMax = field(default_factory=SlidingMax, init=False, repr=False)
    _peak_need: SlidingMax = field(default_factory=SlidingMax, init=False, repr=False)
    _scaled: tuple[Forecast, int, Forecast] | None = field(default=None, init=False, repr=False)
    _peak_ahead: tuple[Forecast, int, bool, float, float] | None = field(
        default=None, init=False, repr=False
    )
    _outrun_at: float = field(default=-math.inf, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.headroom <= 1:
            raise InvalidInput(f"headroom must be in (0, 1], got {self.headroom}")
        if self.scale_in_after_s < 0:
            raise InvalidInput(f"scale_in must be >= 0, got {self.scale_in_after_s}")
        if not 0 <= self.risk < 0.5:
            raise InvalidInput(f"risk must be in [0, 0.5), got {self.risk}")
        self.replica_rps = _replica_rps(self.batching.optimizer, self.headroom)
        if self.replica_rps <= 0:
            raise InvalidInput("no config is predicted to meet the SLO on one replica")

    # -- the ForecastingPolicy seam, delegated ----------------------------------------

    @property
    def spec(self) -> str:
        """The spec as written (`spec_text`), which rebuilds it."""
        return self.spec_text

    @property
    def forecaster(self) -> Forecaster:
        """The batching policy's forecaster (one forecast serves both plans)."""
        return self.batching.forecaster

    @property
    def forecast_step_s(self) -> float:
        """The batching policy's forecast step, in seconds."""
        return self.batching.forecast_step_s

    @property
    def uses_events(self) -> bool:
        """Whether the batching policy's forecasts take declared events in."""
        return self.batching.uses_events

    @property
    def history_s(self) -> float:
        """How much history, in seconds, the batching policy's forecaster is refitted on."""
        return self.batching.history_s

    @property
    def optimizer(self) -> ConfigOptimizer:
        """The batching policy's optimiser, compiled for one replica."""
        return self.batching.optimizer

    def initial_config(self) -> BatchConfig:
        """The batching policy's starting config."""
        return self.batching.initial_config()

    def replan(self, optimizer: ConfigOptimizer) -> None:
        """A table rebuilt for one replica: batches and the replica count plan with it.
        One that says no replica can meet the SLO keeps the replica capacity it had."""
        self.batching.replan(optimizer)
        self._peak_ahead = None
        self.replica_rps = _replica_rps(optimizer, self.headroom) or self.replica_rps

    def horizon_s(self, warmup_s: float, tick_s: float, reload_s: float = 0.0) -> float:
        """Far enough to see a rise a new replica must be started for."""
        batching = self.batching.horizon_s(warmup_s, tick_s, reload_s)
        return max(batching, self._lead_s(warmup_s, tick_s))

    # -- deciding ---------------------------------------------------------------------

    def decide(self, snapshot: Snapshot) -> Decision:
        """Batches: the batching policy's decision on one ready replica's share of the load
        and of the forecast. Replicas (when the fleet scales): out to what the larger of
        the forecast's upper bound over a new replica's lead time and the load measured now
        needs; in only to what the highest load measured, and the replicas wanted, over
        `scale_in_after_s` need. The reason says why the count moved, then the batches'.
        With a fixed fleet, batches only, for one worker's share."""
        fleet = snapshot.fleet
        if fleet is None:  # a fixed fleet: batches only, for one replica's share
            return self.batching.decide(self._per_replica(snapshot, snapshot.workers))
        ready = max(1, fleet.ready)
        batches = self.batching.decide(self._per_replica(snapshot, ready))
        replicas, why = self._replicas(snapshot, fleet)
        reason = batches.reason if why is None else f"{why}; {batches.reason}"
        return evolve(batches, reason=reason, replicas=replicas)

    def replicas_for(self, rate_rps: float) -> int:
        """The replicas `rate_rps` (requests per second) needs at `replica_rps` each, at least 1."""
        return max(1, math.ceil(rate_rps / self.replica_rps - 1e-9))

    def _lead_s(self, warmup_s: float, tick_s: float) -> float:
        warm_s = warm_time_s(0, self.batching.optimizer.largest_cap, warmup_s)
        return self.startup_s + warm_s + self.batching.forecast_step_s + 2 * tick_s

    def _replicas(self, snapshot: Snapshot, fleet: FleetView) -> tuple[int, str | None]:
        now_rps = snapshot.observation.arrival_rate_rps
        lead_s = self._lead_s(snapshot.warmup_s, snapshot.tick_s)
        quantile = self._quantile_allowed(snapshot)
        ahead_rps, at_s = self._peak_within(snapshot, lead_s, quantile)
        need_ahead = self.replicas_for(ahead_rps)
        need_now = self.replicas_for(now_rps)
        if need_now > need_ahead:  # the load outran the forecast's sizing
            self._outrun_at = snapshot.now
        # Both the load measured and what the forecast asked for, over the scale-in
        # window: a replica goes only when neither has wanted it for that long.
        need = max(need_ahead, need_now)
        for window, value in ((self._peak_rps, now_rps), (self._peak_need, need)):
            window.push(snapshot.now, value)
            window.expire(snapshot.now - self.scale_in_after_s)
        desired = fleet.desired
        if need > desired:
            wanted = need
            bound = f"{1 - self.risk:.0%} quantile" if quantile else "upper bound"
            source = (
                f"forecast {bound} {ahead_rps:.0f} req/s at +{at_s:.0f} s"
                if need_ahead >= need_now
                else f"{now_rps:.0f} req/s measured now"
            )
            return wanted, (
                f"{source} needs {wanted} replicas ({self.replica_rps:.0f} req/s each): "
                f"starting {wanted - desired} (serving in about {lead_s:.0f} s)"
            )
        peak_rps = self._peak_rps.max()
        wanted = max(self.replicas_for(peak_rps), int(self._peak_need.max()))
        if wanted < desired:
            return wanted, (
                f"the highest load measured over the last {self.scale_in_after_s:.0f} s "
                f"({peak_rps:.0f} req/s) and the forecast over it need {wanted} replicas: "
                f"releasing {desired - wanted}"
            )
        return desired, None

    def _quantile_allowed(self, snapshot: Snapshot) -> bool:
        """Whether the fleet may be sized for the forecast's quantile rather than its
        upper bound: a risk budget is set, and the forecast touches no declared event,
        is no fallback's, and has not been outrun by the load within the scale-in window."""
        forecast = snapshot.forecast
        return (
            self.risk > 0
            and forecast is not None
            and not forecast.events
            and forecast.fallback is None
            and snapshot.now - self._outrun_at > self.scale_in_after_s
        )

    def _peak_within(
        self, snapshot: Snapshot, lead_s: float, quantile: bool
    ) -> tuple[float, float]:
        """The forecast's highest bound (its upper bound, or with `quantile` its
        quantile 1 - `risk`) within `lead_s`, and how far ahead it is."""
        forecast = snapshot.forecast
        if forecast is None:
            return 0.0, 0.0
        # Forecast steps are in time order: those within the lead are a prefix, whose
        # peak is found once per forecast, prefix and rule, not every tick.
        steps = int(np.searchsorted(forecast.times_s, snapshot.now + lead_s, side="right"))
        if steps == 0:
            return 0.0, 0.0
        cached = self._peak_ahead
        if (
            cached is None
            or cached[0] is not forecast
            or cached[1] != steps
            or cached[2] != quantile
        ):
            bound = self._bound_rps(forecast, quantile)[:steps]
            peak = int(np.argmax(bound))
            cached = (forecast, steps, quantile, float(bound[peak]), float(forecast.times_s[peak]))
            self._peak_ahead = cached
        return cached[3], max(0.0, cached[4] - snapshot.now)

    def _bound_rps(self, forecast: Forecast, quantile: bool) -> np.ndarray:
        """The upper bound, or the quantile 1 - `risk` of a normal whose central
        `level` interval is the band: mean + (z(1 - risk) / z((1 + level) / 2)) x
        (upper - mean), at most the upper bound."""
        if not quantile:
            return forecast.upper_rps
        normal = NormalDist()
        share = normal.inv_cdf(1 - self.risk) / normal.inv_cdf((1 + forecast.level) / 2)
        mean = forecast.mean_rps
        return mean + min(1.0, max(0.0, share)) * (forecast.upper_rps - mean)

    def _per_replica(self, snapshot: Snapshot, replicas: int) -> Snapshot:
        """The pool as one replica of `replicas` sees it: its share of the load now and
        of the forecast (the optimiser is compiled for one replica)."""
        if replicas <= 1:
            return snapshot
        observation = snapshot.observation
        share = evolve(observation, rate_rps=observation.arrival_rate_rps / replicas)
        return evolve(snapshot, observation=share, forecast=self._share(snapshot, replicas))

    def _share(self, snapshot: Snapshot, replicas: int) -> Forecast | None:
        forecast = snapshot.forecast
        if forecast is None:
            return None
        cached = self._scaled
        if cached is not None and cached[0] is forecast and cached[1] == replicas:
            return cached[2]
        scaled = replace(
            forecast,
            mean=forecast.mean / replicas,
            lower=forecast.lower / replicas,
            upper=forecast.upper / replicas,
        )
        self._scaled = (forecast, replicas, scaled)
        return scaled


def _replica_rps(optimizer: ConfigOptimizer, headroom: float) -> float:
    """What one replica serves within the SLO at its best config, with headroom (0: no
    config is predicted to meet it)."""
    caps = np.unique(optimizer.table.caps)
    return headroom * max(optimizer.capacity_rps(int(cap)) for cap in caps)
