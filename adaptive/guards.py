"""Guardrails around any policy: operator bounds, dwell against flapping, a step limit.

Moves that protect latency (a larger cap, a shorter timeout, or any move the policy marks
`protective`, such as AIMD's cut after a miss) apply at once, a larger cap by at most
`max_step` times per decision. Moves that save cost (a smaller cap, a longer timeout)
apply only once every proposal for `dwell_s` seconds has wanted them, and then only as
far as the most cautious of those proposals (Kubernetes' HPA stabilises scale-down so):
a policy that changes its mind every tick on a noisy load never reaches the workers.
Timeout changes smaller than `hysteresis` (relative) are ignored. Delays are seconds, never ticks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from adaptive.config import BatchConfig
from adaptive.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class Guardrails:
    """The operator's limits on what a policy may do."""

    min_batch: int = 1
    max_batch: int = 4096
    min_timeout_s: float = 0.0
    max_timeout_s: float = 1.0
    dwell_s: float = 60.0
    max_step: float = 4.0
    hysteresis: float = 0.25

    def __post_init__(self) -> None:
        if not 1 <= self.min_batch <= self.max_batch:
            raise InvalidInput(
                f"guard bounds need 1 <= min_batch <= max_batch, got {self.min_batch}, "
                f"{self.max_batch}"
            )
        if not 0 <= self.min_timeout_s <= self.max_timeout_s:
            raise InvalidInput("guard bounds need 0 <= min_timeout <= max_timeout")
        if self.dwell_s < 0 or self.max_step < 1 or not 0 <= self.hysteresis < 1:
            raise InvalidInput("guard needs dwell >= 0, max_step >= 1 and hysteresis in [0, 1)")

    def clamp(self, config: BatchConfig) -> BatchConfig:
        cap = min(max(config.max_batch_size, self.min_batch), self.max_batch)
        timeout = min(max(config.timeout_s, self.min_timeout_s), self.max_timeout_s)
        if cap == config.max_batch_size and timeout == config.timeout_s:
            return config
        return BatchConfig(cap, timeout)


class Guard:
    """Applies `Guardrails` over time; its state is the pending cost-saving moves."""

    def __init__(self, rails: Guardrails) -> None:
        self.rails = rails
        self._smaller_since: float | None = None
        self._smaller_cap = 0  # the largest cap proposed since then
        self._longer_since: float | None = None
        self._longer_timeout = math.inf  # the shortest timeout proposed since then

    def apply(
        self, now: float, current: BatchConfig, proposed: BatchConfig, protective: bool = False
    ) -> tuple[BatchConfig, str | None]:
        """The config to run, and a note when the guard changed the proposal."""
        wanted = self.rails.clamp(proposed)
        if protective:
            self._smaller_since = self._longer_since = None
            return wanted, None if wanted == proposed else "clamped to operator bounds"
        cap, cap_note = self._cap(now, current.max_batch_size, wanted.max_batch_size)
        timeout, timeout_note = self._timeout(now, current.timeout_s, wanted.timeout_s)
        notes = [
            n
            for n in (
                None if wanted == proposed else "clamped to operator bounds",
                cap_note,
                timeout_note,
            )
            if n
        ]
        chosen = (
            current
            if (cap, timeout) == (current.max_batch_size, current.timeout_s)
            else BatchConfig(cap, timeout)
        )
        return chosen, "; ".join(notes) or None

    def _cap(self, now: float, current: int, wanted: int) -> tuple[int, str | None]:
        if wanted >= current:
            self._smaller_since = None
            limit = max(current + 1, math.floor(current * self.rails.max_step))
            return (
                (limit, f"cap step limited to x{self.rails.max_step:g}")
                if wanted > limit
                else (wanted, None)
            )
        if self._smaller_since is None:
            self._smaller_since, self._smaller_cap = now, wanted
        self._smaller_cap = max(self._smaller_cap, wanted)
        held_s = now - self._smaller_since
        if held_s < self.rails.dwell_s:
            return (
                current,
                f"cap {wanted} held back for dwell ({held_s:.0f} of {self.rails.dwell_s:g} s)",
            )
        self._smaller_since = None
        return max(self._smaller_cap, math.ceil(current / self.rails.max_step)), None

    def _timeout(self, now: float, current: float, wanted: float) -> tuple[float, str | None]:
        if abs(wanted - current) <= self.rails.hysteresis * max(current, 1e-3):
            self._longer_since = None
            return current, None
        if wanted < current:
            self._longer_since = None
            return wanted, None
        if self._longer_since is None:
            self._longer_since, self._longer_timeout = now, wanted
        self._longer_timeout = min(self._longer_timeout, wanted)
        held_s = now - self._longer_since
        if held_s < self.rails.dwell_s:
            return (
                current,
                f"longer timeout held back for dwell ({held_s:.0f} of {self.rails.dwell_s:g} s)",
            )
        self._longer_since = None
        return self._longer_timeout, None
