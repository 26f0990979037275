"""The batch configuration a worker runs with: the two knobs Tidal tunes."""

import math
from dataclasses import dataclass

from adaptive.errors import InvalidInput
from adaptive.units import format_duration


@dataclass(frozen=True, slots=True)
class BatchConfig:
    """How a worker forms batches.

    max_batch_size: the most requests one batch may hold.
    timeout_s: how long the oldest queued request may wait for the batch to fill before
        a free worker dispatches what is queued (Triton's max_queue_delay); 0 dispatches
        at once.
    """

    max_batch_size: int
    timeout_s: float

    def __post_init__(self) -> None:
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int):
            raise InvalidInput(f"max_batch_size must be an integer, got {self.max_batch_size!r}")
        if self.max_batch_size < 1:
            raise InvalidInput(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if not math.isfinite(self.timeout_s) or self.timeout_s < 0:
            raise InvalidInput(f"timeout must be a finite value >= 0, got {self.timeout_s}")

    def describe(self) -> str:
        """The spec form, as operators write it: "max_batch=32,timeout=10ms"."""
        return f"max_batch={self.max_batch_size},timeout={format_duration(self.timeout_s)}"
