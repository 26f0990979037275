"""Guardrails around any policy: operator bounds, dwell against flapping, a step limit.

Moves that protect latency (a larger cap, a shorter timeout, or any move the policy marks
`protective`, such as AIMD's cut after a miss) apply at once, a larger cap by at most
`max_step` times per decision. Moves that save cost (a smaller cap, a longer timeout)
apply only once every proposal for `dwell_s` seconds has wanted them, and then only as
far as the most cautious of those proposals (Kubernetes' HPA stabilises scale-down so):
a policy that changes its mind every tick on a noisy load never reaches the workers.
Timeout changes smaller than `hysteresis` (relative) are ignored. Delays are seconds, never ticks.

The warm target (`BatchConfig.warm_target`, warm-ahead) is a knob of its own: raising it
protects latency and applies at once, whatever the cap's step limit or dwell do; lowering
it saves cost and waits for the dwell like a smaller cap. The operator's `max_batch`
bounds it too (a bucket above the largest cap the pool may ever run would be warmed for
nothing); `min_batch` does not, as the warm target is never below the cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from adaptive.config import BatchConfig
from tidal_base.errors import InvalidInput


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
        """`config` inside the operator's bounds, its warm target kept up to `max_batch`."""
        if (
            self.min_batch <= config.max_batch_size
            and config.warm_target <= self.max_batch
            and self.min_timeout_s <= config.timeout_s <= self.max_timeout_s
        ):
            return config  # the common case, every tick: nothing to rebuild
        return replace(
            config,
            max_batch_size=min(max(config.max_batch_size, self.min_batch), self.max_batch),
            timeout_s=min(max(config.timeout_s, self.min_timeout_s), self.max_timeout_s),
            warm_max_batch=min(config.warm_target, self.max_batch),
        )


class _Settling:
    """A value that may rise at once but falls only after every proposal for `dwell_s`
    wanted it lower, and then only to the highest of those proposals."""

    def __init__(self, dwell_s: float) -> None:
        self.dwell_s = dwell_s
        self._since: float | None = None
        self._highest = -math.inf

    def reset(self) -> None:
        self._since = None

    def settle(self, now: float, current: float, wanted: float) -> tuple[float, float | None]:
        """(value to run, seconds held back so far, or None when not held)."""
        if wanted >= current:
            self._since = None
            return wanted, None
        if self._since is None:
            self._since, self._highest = now, wanted
        self._highest = max(self._highest, wanted)
        held_s = now - self._since
        if held_s < self.dwell_s:
            return current, held_s
        self._since = None
        return self._highest, None


class Guard:
    """Applies `Guardrails` over time; its state is the pending cost-saving moves."""

    def __init__(self, rails: Guardrails) -> None:
        """`rails`: the limits it applies, with no move held back yet."""
        self.rails = rails
        self._cap = _Settling(rails.dwell_s)
        self._warm = _Settling(rails.dwell_s)
        self._timeout = _Settling(rails.dwell_s)  # settles -timeout: longer waits slowly

    def apply(
        self, now: float, current: BatchConfig, proposed: BatchConfig, protective: bool = False
    ) -> tuple[BatchConfig, str | None]:
        """The config to run, and a note when the guard changed the proposal."""
        wanted = self.rails.clamp(proposed)
        if wanted == current:  # the common tick: nothing to move, nothing pending
            for settling in (self._cap, self._warm, self._timeout):
                settling.reset()
            return current, None if wanted == proposed else "clamped to operator bounds"
        notes = [] if wanted == proposed else ["clamped to operator bounds"]
        if protective:
            for settling in (self._cap, self._warm, self._timeout):
                settling.reset()
            return wanted, "; ".join(notes) or None
        cap = self._step_cap(now, current.max_batch_size, wanted.max_batch_size, notes)
        warm = self._settle_warm(now, current.warm_target, wanted.warm_target, cap, notes)
        timeout = self._settle_timeout(now, current.timeout_s, wanted.timeout_s, notes)
        # The warm target settles on its own: a cap held back or step-limited keeps it.
        chosen = replace(wanted, max_batch_size=cap, timeout_s=timeout, warm_max_batch=warm)
        # What the dwell holds stays inside the bounds too: a config in force from before
        # the bounds (or an operator's pin) is not kept outside them for the dwell.
        chosen = self.rails.clamp(chosen)
        return current if chosen == current else chosen, "; ".join(notes) or None

    def _step_cap(self, now: float, current: int, wanted: int, notes: list[str]) -> int:
        limit = max(current + 1, math.floor(current * self.rails.max_step))
        if wanted > limit:
            notes.append(f"cap step limited to x{self.rails.max_step:g}")
            wanted = limit
        cap, held_s = self._cap.settle(now, current, wanted)
        if held_s is not None:
            notes.append(
                f"cap {wanted} held back for dwell ({held_s:.0f} of {self.rails.dwell_s:g} s)"
            )
            return cap
        return max(int(cap), math.ceil(current / self.rails.max_step))

    def _settle_warm(
        self, now: float, current: int, wanted: int, cap: int, notes: list[str]
    ) -> int:
        warm, held_s = self._warm.settle(now, current, wanted)
        # A warm target held only as far as the cap is held is told by the cap's note.
        if held_s is not None and warm > cap:
            notes.append(
                f"warm {current} kept for dwell ({held_s:.0f} of {self.rails.dwell_s:g} s)"
            )
        return int(warm)

    def _settle_timeout(self, now: float, current: float, wanted: float, notes: list[str]) -> float:
        if abs(wanted - current) <= self.rails.hysteresis * max(current, 1e-3):
            self._timeout.reset()
            return current
        negated, held_s = self._timeout.settle(now, -current, -wanted)
        if held_s is not None:
            notes.append(
                f"longer timeout held back for dwell ({held_s:.0f} of {self.rails.dwell_s:g} s)"
            )
        return -negated
