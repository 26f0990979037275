"""The batch configuration a worker runs with: the two knobs Tidal tunes."""

import math
from dataclasses import dataclass

from tidal_base.errors import InvalidInput
from tidal_base.units import format_duration

MAX_BATCH_SIZE = 65536
"""The largest cap (or warm size) a person may ask for, in a spec or through either API."""
MAX_TIMEOUT_S = 60.0
"""The longest batch timeout a person may ask for, in a spec or through either API."""


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """How a worker forms batches.

    max_batch_size: the most requests one batch may hold.
    timeout_s: how long the oldest queued request may wait for the batch to fill before
        a free worker dispatches what is queued (Triton's max_queue_delay); 0 dispatches
        at once.
    warm_max_batch: keep batch-size buckets warm up to this size, so a cap expected soon
        is ready when it is needed without serving it before. 0 means up to the cap.

    One normal form: a warm_max_batch at or below the cap asks for nothing the cap does
    not already warm, so it is stored as 0. "No warm-ahead" then has one spelling, and
    two configs are equal exactly when they run the same (`warm_target` is the same),
    also after a round trip through the API's dict, which writes `warm_target`.
    """

    max_batch_size: int
    timeout_s: float
    warm_max_batch: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int):
            raise InvalidInput(f"max_batch_size must be an integer, got {self.max_batch_size!r}")
        if self.max_batch_size < 1:
            raise InvalidInput(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not math.isfinite(self.timeout_s) or self.timeout_s < 0:
            raise InvalidInput(f"timeout must be a finite value >= 0, got {self.timeout_s}")
        warm = self.warm_max_batch
        if isinstance(warm, bool) or not isinstance(warm, int) or warm < 0:
            raise InvalidInput(f"warm_max_batch must be an integer >= 0, got {warm!r}")
        if warm <= self.max_batch_size:
            object.__setattr__(self, "warm_max_batch", 0)  # the normal form (see above)

    @property
    def warm_target(self) -> int:
        """The largest batch size the workers should keep warm."""
        return max(self.max_batch_size, self.warm_max_batch)

    def describe(self) -> str:
        """The spec form, as operators write it: "max_batch=32,timeout=10ms"."""
        text = f"max_batch={self.max_batch_size},timeout={format_duration(self.timeout_s)}"
        return text + (f",warm={self.warm_max_batch}" if self.warm_max_batch else "")
