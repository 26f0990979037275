"""What putting a new config in force costs the engine that serves it.

Engines pay for a change in two ways. Tidal's worker warms each batch-size bucket it has
not served (CUDA Graph capture, compiled shapes) one after another while the old cap
serves: a cost per bucket, paid only when the cap rises (`adaptive.warmup`). Triton pays
for any change at all, a timeout too: it loads a new model instance beside the old one,
which serves until the swap (2-4 s measured). `ChangeCost` says both in seconds, so the
planner leads a change by what it costs and the controller does not flap an engine whose
changes are dear; nothing here names an engine. `ReloadTracker` is the simulator's model
of a reloading engine: the old config serves until the reload is done.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from adaptive.config import BatchConfig
from tidal_base.errors import InvalidInput

# A change to a reloading engine is held until the last one has been in force this many
# reloads: one to finish it, one more to observe it serving before moving again.
RELOAD_SPACING = 2.0


@dataclass(frozen=True, slots=True)
class ChangeCost:
    """Seconds a config change costs an engine.

    warmup_per_bucket_s: each batch-size bucket warmed when the cap (or warm target)
        rises, one after another, the old cap serving meanwhile.
    reload_s: any change: the engine reloads the model, the old config serving until
        the new one is in force.
    """

    warmup_per_bucket_s: float = 0.0
    reload_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("warmup_per_bucket_s", "reload_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                label = name.removesuffix("_s")
                raise InvalidInput(f"{label} must be a duration >= 0, got {value}")

    @property
    def spacing_s(self) -> float:
        """The least time between two changes: none for an engine that does not reload."""
        return RELOAD_SPACING * self.reload_s

    def describe(self) -> str:
        """The costs in words, for logs and the API: "warm-up 0.5 s per bucket, reload 3 s per
        change", or "free"."""
        parts = []
        if self.warmup_per_bucket_s:
            parts.append(f"warm-up {self.warmup_per_bucket_s:g} s per bucket")
        if self.reload_s:
            parts.append(f"reload {self.reload_s:g} s per change")
        return ", ".join(parts) or "free"


class ReloadTracker:
    """The config in force on an engine that reloads for every change, on times passed in.

    A request for a different config starts a reload that ends `reload_s` later; a
    request made during a reload replaces it and starts over (the engine loads the
    newest config), and the old config serves until a reload ends.
    """

    def __init__(self, reload_s: float, initial: BatchConfig) -> None:
        """`reload_s`: how long each reload takes, in seconds (`InvalidInput` unless finite and >=
        0). `initial`: the config in force at the start."""
        if not math.isfinite(reload_s) or reload_s < 0:
            raise InvalidInput(f"reload must be a duration >= 0, got {reload_s}")
        self.reload_s = reload_s
        self._in_force = initial
        self._pending: tuple[BatchConfig, float] | None = None  # (config, done_at)
        self.reloads = 0

    def request(self, config: BatchConfig, now: float) -> None:
        """Ask at `now` for `config`: a reload toward it starts (and is counted in `reloads`),
        replacing any under way, unless it is already in force or being loaded; asking again for
        the config in force drops the reload under way."""
        self._advance(now)
        target = self._pending[0] if self._pending else self._in_force
        if config == target:
            return
        if config == self._in_force:
            self._pending = None  # back to what serves: the reload is moot
            return
        self._pending = (config, now + self.reload_s)
        self.reloads += 1

    def in_force(self, now: float) -> BatchConfig:
        """The config serving at `now` (the old one until its reload ends). Times passed in must not
        go back."""
        self._advance(now)
        return self._in_force

    @property
    def reloading(self) -> bool:
        """Whether a reload was under way at the last `request` or `in_force` (it is not advanced to
        any later time)."""
        return self._pending is not None

    def _advance(self, now: float) -> None:
        if self._pending is not None and self._pending[1] <= now:
            self._in_force, self._pending = self._pending[0], None
