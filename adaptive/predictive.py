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

from dataclasses import dataclass

import numpy as np

from adaptive.config import BatchConfig
from adaptive.optimizer import Choice, ConfigOptimizer
from adaptive.policy import Decision, Snapshot
from adaptive.units import format_duration
from adaptive.warmup import buckets_to_warm, warm_time_s
from forecaster.models import Forecaster


@dataclass
class PredictivePolicy:
    """Forecast-driven choice of cap and timeout; `forecaster` is fed by the controller."""

    optimizer: ConfigOptimizer
    forecaster: Forecaster
    forecast_step_s: float = 10.0
    lead_s: float | None = None  # None: derived from warm-up time and the tick
    name: str = "predictive"
    spec_text: str = "predictive"

    @property
    def spec(self) -> str:
        return self.spec_text

    def initial_config(self) -> BatchConfig:
        return BatchConfig(32, 0.01)

    def horizon_s(self, warmup_s: float, tick_s: float) -> float:
        if self.lead_s is not None:
            return self.lead_s
        return warm_time_s(1, self.optimizer.largest_cap, warmup_s) + self._slack_s(
            warmup_s, tick_s
        )

    def _slack_s(self, warmup_s: float, tick_s: float) -> float:
        return self.forecast_step_s + warmup_s + 2 * tick_s

    def decide(self, snapshot: Snapshot) -> Decision:
        forecast = snapshot.forecast
        if forecast is None:
            raise ValueError("predictive policy needs a forecast in the snapshot")
        upper_rps = forecast.upper_rps
        now_rps = max(snapshot.observation.arrival_rate_rps, float(upper_rps[0]))
        current = self.optimizer.choose(now_rps)
        ahead = self._look_ahead(snapshot, forecast.times_s, upper_rps, current)
        if ahead is None:
            return self._decision(current, now_rps, "", snapshot)
        at_s, rate_rps, cap = ahead
        choice = self.optimizer.choose(now_rps, min_cap=cap)
        serving = snapshot.serving_cap
        warming = buckets_to_warm(snapshot.warm_cap, cap)
        why = (
            f"forecast upper bound {_rate(rate_rps)} at +{at_s:.0f} s exceeds what batch "
            f"{serving} can serve ({_rate(self.optimizer.capacity_rps(serving))})"
        )
        if warming:
            why += f"; warming {_and(warming)} now"
        return self._decision(choice, rate_rps, why, snapshot)

    def _look_ahead(
        self, snapshot: Snapshot, times_s: np.ndarray, upper_rps: np.ndarray, current: Choice
    ) -> tuple[float, float, int] | None:
        """The largest (time ahead, rate, cap) that must start warming now; forecast
        times are in the controller's clock."""
        lead_s = self.horizon_s(snapshot.warmup_s, snapshot.tick_s)
        slack_s = self._slack_s(snapshot.warmup_s, snapshot.tick_s)
        best: tuple[float, float, int] | None = None
        need = current.config.max_batch_size
        for i in range(1, times_s.size):
            at_s = float(times_s[i]) - snapshot.now
            if at_s > lead_s:
                break
            cap = self.optimizer.choose(float(upper_rps[i])).config.max_batch_size
            if (
                cap > need
                and at_s <= warm_time_s(snapshot.warm_cap, cap, snapshot.warmup_s) + slack_s
            ):
                best, need = (at_s, float(upper_rps[i]), cap), cap
        return best

    def _decision(self, choice: Choice, rate_rps: float, why: str, snapshot: Snapshot) -> Decision:
        config = choice.config
        if not why:
            why = (
                f"expecting up to {_rate(rate_rps)} now: batch {config.max_batch_size}, "
                f"timeout {format_duration(config.timeout_s)} is the cheapest config "
                f"predicted to meet the SLO"
            )
            if not choice.meets_slo:
                why = f"expecting {_rate(rate_rps)}: no config is predicted to meet the SLO"
        return Decision(
            config,
            why,
            predicted_p99_s=choice.chosen.predicted_p99_s,
            planned_rate_rps=rate_rps,
            alternatives=choice.alternatives,
        )


def _rate(rate_rps: float) -> str:
    return f"{rate_rps / 1e3:.1f}k req/s" if rate_rps >= 1e3 else f"{rate_rps:.0f} req/s"


def _and(items: tuple[int, ...]) -> str:
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
