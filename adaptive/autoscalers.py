"""Replica autoscalers as users run them, with batching left static: the baselines.

`serve-autoscaler` follows Ray Serve's default policy (Ray 2.60,
`ray.serve.autoscaling_policy`): the replicas wanted are the ongoing requests (queued
and executing, averaged over `look_back_period_s`, 30 s) over `target_ongoing_requests`
(2 by default), times a scaling factor (1), rounded up; a move up is made once it has
been wanted for `upscale_delay_s` (30 s) without a break, a move down after
`downscale_delay_s` (600 s). `hpa` follows the Kubernetes HorizontalPodAutoscaler on a
utilisation metric (autoscaling/v2): every sync period (15 s) the replicas wanted are
ready replicas x utilisation / target, unless that ratio is within the tolerance (0.1)
of 1; scaling down takes the highest recommendation of the stabilisation window (300 s),
and a step up is at most double the replicas or four more, whichever is larger.

Both hold one batch config throughout, as Serve's `@serve.batch` or a Triton model
config does, and decide replicas from what they measured: neither looks ahead.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from adaptive.config import BatchConfig
from adaptive.fleet import FleetView
from adaptive.policy import Decision, Snapshot
from tidal_base.errors import InvalidInput


def ongoing_requests(snapshot: Snapshot) -> float:
    """Requests queued or executing in the pool over the last tick: the waiting ones at
    its end plus the mean number in batches being run (busy share of the tick times the
    mean batch), as Serve's replicas count them."""
    observation = snapshot.observation
    executing = observation.busy_s / observation.window_s * (observation.mean_batch_size or 0.0)
    return observation.queue_depth + executing


@dataclass
class ServeAutoscalerPolicy:
    """Ray Serve's default autoscaling policy over a static batch config."""

    config: BatchConfig
    target_ongoing_requests: float = 2.0
    look_back_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    scaling_factor: float = 1.0
    _samples: deque[tuple[float, float]] = field(default_factory=deque, init=False)
    _wanted_since: float | None = field(default=None, init=False)
    _wanted_up: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.target_ongoing_requests <= 0 or self.scaling_factor <= 0:
            raise InvalidInput("target_ongoing and factor must be > 0")
        if self.look_back_s <= 0 or self.upscale_delay_s < 0 or self.downscale_delay_s < 0:
            raise InvalidInput("look_back must be > 0 and the delays >= 0")

    @property
    def spec(self) -> str:
        """The spec "serve-autoscaler:max_batch=N,timeout=T,target_ongoing=X": the
        look-back, the delays and the factor are not in it, so it rebuilds this policy
        only where they are the defaults."""
        return (
            f"serve-autoscaler:{self.config.describe()},target_ongoing="
            f"{self.target_ongoing_requests:g}"
        )

    def initial_config(self) -> BatchConfig:
        """The static batch config, held throughout."""
        return self.config

    def decide(self, snapshot: Snapshot) -> Decision:
        """The static config, and (when the fleet scales) the replicas Serve's rule wants:
        the ongoing requests averaged over `look_back_s`, over `target_ongoing_requests`,
        scaled by `scaling_factor` from the ready replicas and rounded up, once wanted in
        one direction without a break for `upscale_delay_s` (up) or `downscale_delay_s`
        (down); until then the replicas desired now. With a fixed fleet, no replica count."""
        fleet = snapshot.fleet
        if fleet is None:
            return Decision(self.config, "static batching; the fleet is fixed")
        ongoing = self._mean_ongoing(snapshot)
        running = max(1, fleet.ready)
        wanted = _scaled(ongoing / self.target_ongoing_requests, running, self.scaling_factor)
        replicas = self._after_delay(snapshot.now, wanted, fleet)
        why = (
            f"{ongoing:.1f} ongoing requests over the last {self.look_back_s:g} s "
            f"for a target of {self.target_ongoing_requests:g} per replica: {wanted} wanted"
        )
        if replicas != fleet.desired:
            why += f"; scaling to {replicas}"
        elif wanted != fleet.desired:
            delay = self.upscale_delay_s if wanted > fleet.desired else self.downscale_delay_s
            why += f"; held until wanted for {delay:g} s"
        return Decision(self.config, why, replicas=replicas)

    def _mean_ongoing(self, snapshot: Snapshot) -> float:
        samples = self._samples
        samples.append((snapshot.now, ongoing_requests(snapshot)))
        while samples[0][0] <= snapshot.now - self.look_back_s:
            samples.popleft()
        return sum(v for _, v in samples) / len(samples)

    def _after_delay(self, now: float, wanted: int, fleet: FleetView) -> int:
        """Serve's delay rule: a direction must be wanted without a break for its delay."""
        target = fleet.desired
        if wanted == target:
            self._wanted_since = None
            return target
        up = wanted > target
        if self._wanted_since is None or self._wanted_up != up:
            self._wanted_since, self._wanted_up = now, up
        delay_s = self.upscale_delay_s if up else self.downscale_delay_s
        if now - self._wanted_since + 1e-9 >= delay_s:
            self._wanted_since = None
            return max(1, wanted)
        return target


def _scaled(desired: float, current: int, factor: float) -> int:
    """Serve's scaling factor on the difference, rounded up; a move down never sticks."""
    scaled = math.ceil(current + factor * (desired - current))
    if math.ceil(desired) < current and scaled == current:
        scaled -= 1
    return max(1, scaled)


@dataclass
class HpaPolicy:
    """A Kubernetes HPA on utilisation (busy share of the ready replicas) over a static
    batch config."""

    config: BatchConfig
    target: float = 0.6
    period_s: float = 15.0
    tolerance: float = 0.1
    stabilization_s: float = 300.0
    _busy: list[float] = field(default_factory=lambda: [0.0, 0.0], init=False)  # busy, paid
    _next_sync: float | None = field(default=None, init=False)
    _recommendations: deque[tuple[float, int]] = field(default_factory=deque, init=False)
    _replicas: int | None = field(default=None, init=False)
    _why: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if not 0 < self.target <= 1:
            raise InvalidInput(f"hpa target utilisation must be in (0, 1], got {self.target}")
        if self.period_s <= 0 or self.tolerance < 0 or self.stabilization_s < 0:
            raise InvalidInput("hpa period must be > 0, tolerance and window >= 0")

    @property
    def spec(self) -> str:
        """The spec "hpa:max_batch=N,timeout=T,target=X": the period, the tolerance and the
        window are not in it, so it rebuilds this policy only where they are the defaults."""
        return f"hpa:{self.config.describe()},target={self.target:g}"

    def initial_config(self) -> BatchConfig:
        """The static batch config, held throughout."""
        return self.config

    def decide(self, snapshot: Snapshot) -> Decision:
        """The static config, and (when the fleet scales) the replicas of the last sync:
        every `period_s`, the ready replicas x utilisation over the period / `target`
        (no change when that ratio is within `tolerance` of 1), at most double or four
        more than the replicas desired, whichever is larger; a move down takes the highest
        recommendation of the last `stabilization_s`. Before the first sync, the replicas
        desired now; with a fixed fleet, no replica count."""
        fleet = snapshot.fleet
        if fleet is None:
            return Decision(self.config, "static batching; the fleet is fixed")
        self._busy[0] += snapshot.observation.busy_s
        self._busy[1] += max(1, fleet.ready) * snapshot.observation.window_s
        if self._next_sync is None:
            self._next_sync = snapshot.now + self.period_s
        if snapshot.now + 1e-9 >= self._next_sync:
            self._next_sync += self.period_s
            self._sync(snapshot.now, fleet)
        replicas = self._replicas if self._replicas is not None else fleet.desired
        return Decision(self.config, self._why or "waiting for the first sync", replicas=replicas)

    def _sync(self, now: float, fleet: FleetView) -> None:
        busy_s, paid_s = self._busy
        self._busy = [0.0, 0.0]
        utilization = busy_s / paid_s if paid_s else 0.0
        current = fleet.desired
        ratio = utilization / self.target
        ready = max(1, fleet.ready)
        wanted = current if abs(ratio - 1) <= self.tolerance else math.ceil(ready * ratio)
        wanted = max(1, min(wanted, max(2 * current, current + 4)))  # the default scale-up cap
        self._recommendations.append((now, wanted))
        while self._recommendations[0][0] < now - self.stabilization_s:
            self._recommendations.popleft()
        # Scaling down takes the window's highest recommendation: a dip must last.
        window_high = max(r for _, r in self._recommendations)
        replicas = wanted if wanted >= current else min(current, window_high)
        self._why = (
            f"utilisation {utilization:.0%} over {self.period_s:g} s against a target of "
            f"{self.target:.0%}: {wanted} wanted"
            + (f"; scaling to {replicas}" if replicas != current else "")
            + (
                f" (the highest of the last {self.stabilization_s:g} s)"
                if replicas != wanted and wanted < current
                else ""
            )
        )
        self._replicas = replicas
