"""The live shell's clock: monotonic wall time, zero when the clock is made."""

from __future__ import annotations

import time


class WallClock:
    """Seconds since creation on `time.monotonic()`: immune to wall-clock steps (NTP, DST).

    Starting at zero, like the simulator's clock, keeps the controller's step boundaries
    and forecast times anchored at its start; `origin_s` is the Unix time of that zero."""

    def __init__(self) -> None:
        self._zero = time.monotonic()
        self.origin_s = time.time()

    def now(self) -> float:
        return time.monotonic() - self._zero
