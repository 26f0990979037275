"""`aimd`: Clipper's reactive batch-size control, the field's best-known adaptive baseline.

As in Clipper, the signal is the time a batch takes to run: the cap grows additively
while batches run within `budget` of the SLO (Clipper uses the whole SLO; half leaves
room for queueing) and shrinks multiplicatively when they do not. Reacting to end-to-end
p99 instead would cut the cap exactly when a queue builds, the one time a larger batch
is needed. The cap grows only while batches fill it (mean batch at least `fill` of the
cap): like a TCP window that grows only when used, this keeps an idle pool from climbing
to caps it never exercised. The timeout is fixed. It learns only from batches already
run, so it moves after the load has arrived.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from adaptive.config import BatchConfig
from adaptive.policy import Decision, Snapshot
from tidal_base.errors import InvalidInput
from tidal_base.units import format_duration


@dataclass
class AimdPolicy:
    """Clipper-style AIMD on the batch cap; state is the cap it last chose."""

    timeout_s: float
    start: int = 8
    step: int = 4
    backoff: float = 0.9
    fill: float = 0.8
    budget: float = 0.5
    max_batch: int = 256
    _cap: int = field(init=False)

    def __post_init__(self) -> None:
        if self.step < 1:
            raise InvalidInput(f"step must be >= 1, got {self.step}")
        if not 0 < self.backoff < 1:
            raise InvalidInput(f"backoff must be in (0, 1), got {self.backoff}")
        if not 1 <= self.start <= self.max_batch:
            raise InvalidInput(
                f"start must be in [1, max_batch={self.max_batch}], got {self.start}"
            )
        self._cap = self.start

    @property
    def spec(self) -> str:
        """The spec "aimd:step=S,backoff=B,timeout=T": `start`, `fill`, `budget` and
        `max_batch` are not in it, so it rebuilds this policy only where they are the
        defaults."""
        return (
            f"aimd:step={self.step},backoff={self.backoff:g},"
            f"timeout={format_duration(self.timeout_s)}"
        )

    def initial_config(self) -> BatchConfig:
        """Batch `start` within `timeout_s`."""
        return BatchConfig(self.start, self.timeout_s)

    def decide(self, snapshot: Snapshot) -> Decision:
        """Cut the cap to at most `backoff` x the serving cap when the tick's batches took
        longer than `budget` x the SLO on average (a protective move); raise it to the
        serving cap plus `step`, at most `max_batch`, when they ran within budget and their
        mean size was at least `fill` of the serving cap; otherwise hold. A tick with no
        batches holds. The timeout never changes."""
        seen = snapshot.observation
        serving = snapshot.serving_cap
        if not seen.batches:
            return Decision(BatchConfig(self._cap, self.timeout_s), "no batches ran: holding")
        batch_s = seen.busy_s / seen.batches
        budget_s = self.budget * snapshot.slo_s
        missed = batch_s > budget_s
        if missed:
            self._cap = max(1, min(self._cap, math.floor(serving * self.backoff)))
            reason = (
                f"batches took {batch_s * 1e3:.1f} ms, over the {budget_s * 1e3:g} ms "
                f"budget: cap cut to {self._cap}"
            )
        elif (seen.mean_batch_size or 0) >= self.fill * serving:
            self._cap = min(self.max_batch, max(self._cap, serving + self.step))
            reason = f"full batches within budget ({batch_s * 1e3:.1f} ms): cap up to {self._cap}"
        else:
            reason = "batches do not fill the cap: holding"
        return Decision(BatchConfig(self._cap, self.timeout_s), reason, protective=missed)
