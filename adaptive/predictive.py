"""`predictive`: Tidal's policy. Plan for the forecast's upper bound, warm ahead of ramps.

Each tick it asks the optimiser for the cheapest config that meets the SLO at the load
expected now (the larger of the measured rate and the forecast's upper bound for the
current step). Then it looks ahead: for every forecast step within the lead window it
finds the cap that step's upper bound will need, and if warming the buckets for that cap
takes about as long as the time left before the step, it raises the cap now so the
workers warm while the load is still low. The lead window follows from the warm-up time
and the tick (`lead=auto`): the time to warm every bucket up to the largest cap, plus a
forecast step, a bucket's warm-up and two ticks of slack. When the forecast falls, the
needed cap falls with it and the controller's guards let it shrink after a dwell.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from adaptive.config import BatchConfig
from adaptive.optimizer import Choice, ConfigOptimizer
from adaptive.policy import Decision, Snapshot
from adaptive.sliding import SlidingMax
from adaptive.warmup import buckets_to_warm, warm_time_s
from forecaster.forecast import Forecast
from forecaster.models import Forecaster
from tidal_base.units import format_duration

INFEASIBLE_TIE = 1.1
"""With no config predicted to meet the SLO, the config in force is held while its
predicted p99 is within 10% of the best's."""


@dataclass
class PredictivePolicy:
    """Forecast-driven choice of cap and timeout; `forecaster` is fed by the controller."""

    optimizer: ConfigOptimizer
    forecaster: Forecaster
    forecast_step_s: float = 10.0
    lead_s: float | None = None  # None: derived from warm-up time and the tick
    name: str = "predictive"
    uses_events: bool = True
    history_s: float = 6 * 3600.0
    stickiness: float = 0.05
    window_s: float = 60.0
    spec_text: str = "predictive"
    _recent_high: SlidingMax = field(default_factory=SlidingMax, init=False, repr=False)
    _recent_low: SlidingMax = field(default_factory=SlidingMax, init=False, repr=False)  # negated
    _ticks: int = field(default=0, init=False, repr=False)
    _needs: tuple[Forecast, list[int]] | None = field(default=None, init=False, repr=False)
    _observed_rps: float | None = field(default=None, init=False, repr=False)

    @property
    def spec(self) -> str:
        """The spec as written (`spec_text`), which rebuilds it."""
        return self.spec_text

    def initial_config(self) -> BatchConfig:
        """Batch 32 within 10 ms, before the first decision (until the first forecast, the
        controller's fallback decides)."""
        return BatchConfig(32, 0.01)

    def replan(self, optimizer: ConfigOptimizer) -> None:
        """Plan with `optimizer` from the next decision on; the rates seen (smoothing, the window of
        recent load) are kept, the caps planned per forecast step by the old table dropped."""
        self.optimizer = optimizer
        self._needs = None  # the caps each forecast step needs, by the old table

    def horizon_s(self, warmup_s: float, tick_s: float, reload_s: float = 0.0) -> float:
        """How far ahead, in seconds, the forecast must reach: `lead_s` when given; else the time to
        warm every bucket up to the table's largest cap at `warmup_s` each, plus a forecast step,
        one more bucket's warm-up, two ticks and three reloads (a change to a reloading engine
        serves `reload_s` after it is asked for, and changes are spaced by two)."""
        if self.lead_s is not None:
            return self.lead_s
        return warm_time_s(1, self.optimizer.largest_cap, warmup_s) + self._slack_s(
            warmup_s, tick_s, reload_s
        )

    def _slack_s(self, warmup_s: float, tick_s: float, reload_s: float = 0.0) -> float:
        # A reloading engine puts a change in force `reload_s` after it is asked for, and
        # the controller spaces its changes (ChangeCost.spacing_s): lead by both.
        return self.forecast_step_s + warmup_s + 2 * tick_s + 3 * reload_s

    def decide(self, snapshot: Snapshot) -> Decision:
        """The cheapest config predicted to meet the SLO over the load expected in the next
        `window_s` (the config in force is kept while it meets the SLO there at most
        `stickiness` dearer), its warm target raised now for a forecast step whose buckets
        take about as long to warm as the time left before it. Protective when the config
        in force is predicted to miss (or cannot be predicted). `ValueError` without a
        forecast in the snapshot."""
        forecast = snapshot.forecast
        if forecast is None:
            raise ValueError("predictive policy needs a forecast in the snapshot")
        now_rps = self._rate_now(snapshot, forecast)
        choice = self._serve(snapshot, now_rps, forecast)
        ahead, warm = self._warm(snapshot, forecast)
        config = replace(choice.config, warm_max_batch=warm)
        # When the config in force is predicted to miss, any move the table prefers
        # protects latency, even a smaller cap (a cap past the service budget). So does
        # leaving a config the table cannot predict (an operator's pin that ended, say):
        # it is predicted as unknown, never as the table's nearest edge.
        current_p99_s = self.optimizer.predicted_p99_s(snapshot.config, now_rps)
        reason = self._reason(
            snapshot, choice, now_rps, config, ahead, float(forecast.upper_rps[0])
        )
        # Only an unpredictable config needs saying why (and the check is not free).
        unknown = self.optimizer.outside(snapshot.config) if math.isinf(current_p99_s) else None
        if unknown is not None:
            reason = f"{unknown}, so its latency cannot be predicted: moving off it; {reason}"
        return Decision(
            config,
            reason,
            predicted_p99_s=choice.chosen.predicted_p99_s,
            planned_rate_rps=now_rps,
            alternatives=choice.alternatives,
            protective=current_p99_s > self.optimizer.target_p99_s,
            meets_slo=choice.meets_slo,
        )

    def _rate_now(self, snapshot: Snapshot, forecast: Forecast) -> float:
        """The load expected now: the forecast mean, or what is arriving if more."""
        upper_rps = float(forecast.upper_rps[0])
        observed = self._smoothed(snapshot.observation.arrival_rate_rps, upper_rps)
        return max(observed, float(forecast.mean_rps[0]))

    def _serve(self, snapshot: Snapshot, now_rps: float, forecast: Forecast) -> Choice:
        """The config to serve: cheapest over the planning window's load range."""
        spread = self._spread(snapshot, now_rps, forecast)
        best = self.optimizer.choose(now_rps, spread=spread)
        if not best.meets_slo:  # no config covers the whole range: serve the load of now
            best = self.optimizer.choose(now_rps)
        return self._keep_if_close(snapshot.config, best, now_rps, spread)

    def _warm(
        self, snapshot: Snapshot, forecast: Forecast
    ) -> tuple[tuple[float, float, int] | None, int]:
        """The cap to keep warm: what the band needs now, or a step ahead needs if its
        buckets take about as long to warm as the time left before it."""
        warm = self.optimizer.choose(float(forecast.upper_rps[0])).config.max_batch_size
        ahead = self._look_ahead(snapshot, forecast.times_s, forecast.upper_rps, warm)
        return ahead, (warm if ahead is None else ahead[2])

    def _spread(
        self, snapshot: Snapshot, now_rps: float, forecast: Forecast
    ) -> tuple[float, float]:
        """The range of load expected over the planning window: what arrived in the last
        window (smoothed) and the forecast mean for the next one."""
        # The last `window_s / tick_s` rates (a count of ticks: the live loop's ticks
        # may come late), as sliding extremes rather than a scan every tick.
        self._ticks += 1
        kept = max(1, round(self.window_s / snapshot.tick_s))
        self._recent_high.push(self._ticks, now_rps)
        self._recent_high.expire(self._ticks - kept + 1)
        self._recent_low.push(self._ticks, -now_rps)
        self._recent_low.expire(self._ticks - kept + 1)
        ahead = forecast.mean_rps[forecast.times_s - snapshot.now < self.window_s]
        low = min(-self._recent_low.max(), float(ahead.min()) if ahead.size else now_rps)
        high = max(self._recent_high.max(), float(ahead.max()) if ahead.size else now_rps)
        return low, high

    def _keep_if_close(
        self, current: BatchConfig, best: Choice, rate_rps: float, spread: tuple[float, float]
    ) -> Choice:
        """Keep serving the config in force while it meets the target and costs at most
        `stickiness` more than the best: near a boundary between two configs, load noise
        would otherwise flip between them every few ticks."""
        if current.max_batch_size == best.config.max_batch_size and (
            current.timeout_s == best.config.timeout_s
        ):
            return best
        plain = replace(current, warm_max_batch=0)
        if not best.meets_slo:
            # Nothing meets the SLO: the best effort moves with every wobble of the load
            # (a change a second, each as far from the SLO as the last). Hold the config
            # in force while its predicted p99 is within 10% of the best's.
            held = self.optimizer.predict(plain, rate_rps)
            if held.predicted_p99_s <= best.chosen.predicted_p99_s * INFEASIBLE_TIE:
                return replace(best, chosen=held)
            return best
        points = [self.optimizer.predict(plain, r) for r in (spread[0], rate_rps, spread[1])]
        worst_p99 = max(p.predicted_p99_s for p in points)
        cost = sum(p.busy_per_request_s for p in points) / 3
        if worst_p99 <= self.optimizer.target_p99_s and cost <= best.chosen.busy_per_request_s * (
            1 + self.stickiness
        ):
            return replace(best, chosen=points[1])
        return best

    def _smoothed(self, rate_rps: float, upper_rps: float) -> float:
        """Observed rate smoothed over a few ticks, so per-tick noise does not move the
        timeout back and forth; a surge (20% above the forecast band) counts at once."""
        previous = self._observed_rps if self._observed_rps is not None else rate_rps
        self._observed_rps = previous + 0.3 * (rate_rps - previous)
        return rate_rps if rate_rps > 1.2 * upper_rps else self._observed_rps

    def _caps_needed(self, forecast: Forecast) -> list[int]:
        """The cap each forecast step's upper bound needs; computed once per forecast."""
        if self._needs is None or self._needs[0] is not forecast:
            self._needs = (forecast, _caps_for(self.optimizer, forecast.upper_rps))
        return self._needs[1]

    def _reason(
        self,
        snapshot: Snapshot,
        choice: Choice,
        now_rps: float,
        config: BatchConfig,
        ahead: tuple[float, float, int] | None,
        upper_now_rps: float,
    ) -> str:
        serve = (
            f"expecting {_rate(now_rps)} now: batch {config.max_batch_size}, timeout "
            f"{format_duration(config.timeout_s)} is the cheapest config predicted to meet "
            "the SLO"
        )
        if not choice.meets_slo:
            serve = f"expecting {_rate(now_rps)} now: no config is predicted to meet the SLO"
        warming = buckets_to_warm(snapshot.warm_cap, config.warm_target)
        if not warming:
            return serve
        if ahead is not None:
            rate_rps = ahead[1]
            load = f"forecast upper bound {_rate(rate_rps)} at +{max(ahead[0], 0):.0f} s"
        elif now_rps > upper_now_rps:  # arriving above the band: the forecast lags
            rate_rps = now_rps
            load = (
                f"forecast upper bound {_rate(upper_now_rps)} now, under the "
                f"{_rate(now_rps)} arriving, which"
            )
        else:
            rate_rps = upper_now_rps
            load = f"forecast upper bound {_rate(rate_rps)} now"
        capacity_rps = self.optimizer.capacity_rps(snapshot.warm_cap)
        if _rate(rate_rps) == _rate(capacity_rps):  # "22.1k exceeds 22.1k" reads as a bug
            why = f"reaches the most batch {snapshot.warm_cap} can serve"
        elif rate_rps > capacity_rps:
            why = f"exceeds what batch {snapshot.warm_cap} can serve ({_rate(capacity_rps)})"
        else:
            why = f"is served most cheaply with batch {config.warm_target}"
        return f"{load} {why}; warming {_and(warming)} now; {serve}"

    def _look_ahead(
        self, snapshot: Snapshot, times_s: np.ndarray, upper_rps: np.ndarray, need: int
    ) -> tuple[float, float, int] | None:
        """The largest (time ahead, rate, cap) that must start warming now; forecast
        times are in the controller's clock."""
        lead_s = self.horizon_s(snapshot.warmup_s, snapshot.tick_s, snapshot.reload_s)
        slack_s = self._slack_s(snapshot.warmup_s, snapshot.tick_s, snapshot.reload_s)
        best: tuple[float, float, int] | None = None
        caps = self._caps_needed(snapshot.forecast)
        for i in range(1, times_s.size):
            at_s = float(times_s[i]) - snapshot.now
            if at_s > lead_s:
                break
            cap = caps[i]
            if (
                cap > need
                and at_s <= warm_time_s(snapshot.warm_cap, cap, snapshot.warmup_s) + slack_s
            ):
                best, need = (at_s, float(upper_rps[i]), cap), cap
        return best


def _caps_for(optimizer: ConfigOptimizer, upper_rps: np.ndarray) -> list[int]:
    return [optimizer.choose(float(rate)).config.max_batch_size for rate in upper_rps]


def _rate(rate_rps: float) -> str:
    return f"{rate_rps / 1e3:.1f}k req/s" if rate_rps >= 1e3 else f"{rate_rps:.0f} req/s"


def _and(items: tuple[int, ...]) -> str:
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
