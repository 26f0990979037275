"""The live shell's clock: monotonic wall time."""

from __future__ import annotations

import time


class WallClock:
    """`time.monotonic()`: immune to wall-clock steps (NTP, DST)."""

    def now(self) -> float:
        return time.monotonic()
