"""`reactive`: BentoML-style control from an online latency model and the measured rate.

Each tick it refits `service_time = a + b * batch_size` from the batches the pool ran
(exponentially forgotten least squares over per-tick means), then picks the smallest
power-of-two cap whose throughput keeps utilisation under `utilization` at the measured
rate (and whose batches run within half the SLO), and the longest timeout that fits the
other half. No forecast: it sees a
spike when it arrives, and if the cap it needs is not warmed, the queue builds meanwhile.
It is also the controller's fallback when the forecast goes wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from adaptive.config import BatchConfig
from adaptive.policy import Decision, Snapshot
from tidal_base.errors import InvalidInput


@dataclass
class OnlineLinearFit:
    """Weighted least squares of service seconds on batch size, forgetting old ticks."""

    forget: float = 0.995
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # w, x, y, xx, xy

    def add(self, batch_size: float, service_s: float, weight: float) -> None:
        """Add one observation: a mean batch of `batch_size` took `service_s` seconds, weighted by
        `weight` (the batches it stands for); what was added before is forgotten by `forget`."""
        s = self._sums
        for i, term in enumerate(
            (1.0, batch_size, service_s, batch_size**2, batch_size * service_s)
        ):
            s[i] = s[i] * self.forget + weight * term

    @property
    def ready(self) -> bool:
        """Whether anything with weight has been added: `coefficients` needs it."""
        return self._sums[0] > 0

    def coefficients(self) -> tuple[float, float]:
        """(a, b) of a + b * n. With too little spread in batch size to separate them,
        splits the mean cost evenly between the fixed and per-item parts."""
        w, x, y, xx, xy = self._sums
        mean_x, mean_y = x / w, y / w
        var_x = xx / w - mean_x**2
        if var_x > 1.0 and mean_x > 0:
            b = max((xy / w - mean_x * mean_y) / var_x, 0.0)
            return max(mean_y - b * mean_x, 0.0), b
        return mean_y / 2, mean_y / (2 * max(mean_x, 1.0))


@dataclass
class ReactivePolicy:
    """Chooses from what it measured in the last ticks; no foresight."""

    utilization: float = 0.75
    max_batch: int = 256
    smoothing: float = 0.3
    fit: OnlineLinearFit = field(default_factory=OnlineLinearFit)
    _rate_rps: float | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.utilization < 1:
            raise InvalidInput(f"utilization must be in (0, 1), got {self.utilization}")

    @property
    def spec(self) -> str:
        """The spec "reactive:utilization=U" (`max_batch` and `smoothing` are not in it, so it
        rebuilds this policy only where they are the defaults)."""
        return f"reactive:utilization={self.utilization:g}"

    def initial_config(self) -> BatchConfig:
        """Batch 8 within 5 ms."""
        return BatchConfig(8, 0.005)

    def decide(self, snapshot: Snapshot) -> Decision:
        """Refit the service time on the tick's batches, then the smallest power-of-two cap (at most
        `max_batch`, doubling only while the doubled batch runs within half the SLO) whose
        throughput keeps utilisation under `utilization` at the load planned (the measured rate
        or its smoothed value, whichever is more, plus the backlog to clear in a tick), and the
        longest timeout that fits the other half of the SLO and the time the smoothed rate takes
        to fill the cap. Holds the config in force until a batch has been seen."""
        seen = snapshot.observation
        if seen.batches:
            self.fit.add(seen.mean_batch_size or 0.0, seen.busy_s / seen.batches, seen.batches)
        rate = seen.arrival_rate_rps
        smoothed = rate if self._rate_rps is None else self._rate_rps
        self._rate_rps = smoothed + self.smoothing * (rate - smoothed)
        if not self.fit.ready:
            return Decision(snapshot.config, "no batches seen yet: holding")
        # Backlog counts as load still to serve within the next tick.
        planned = max(rate, self._rate_rps) + seen.queue_depth / snapshot.tick_s
        return self._choose(planned, self._rate_rps, snapshot)

    def _choose(self, rate_rps: float, smoothed_rps: float, snapshot: Snapshot) -> Decision:
        """Cap for the planned rate (peaks count); timeout for the smoothed rate, so that
        tick-to-tick noise does not move it."""
        a, b = self.fit.coefficients()
        budget_s = snapshot.slo_s / 2
        cap = 1
        while (
            cap < self.max_batch
            and a + b * cap * 2 <= budget_s  # a batch must run within half the SLO
            and snapshot.workers * cap / (a + b * cap) * self.utilization < rate_rps
        ):
            cap *= 2
        wait_s = budget_s - (a + b * cap)
        timeout_s = max(0.0, min(wait_s, cap / max(smoothed_rps, 1e-9)))
        reason = (
            f"measured {rate_rps:,.0f} req/s; fitted service {a * 1e3:.2f} ms + "
            f"{b * 1e3:.3f} ms/request: cap {cap} keeps utilisation under {self.utilization:.0%}"
        )
        return Decision(BatchConfig(cap, round(timeout_s, 4)), reason, planned_rate_rps=rate_rps)
