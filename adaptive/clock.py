"""The clock seam: core code is handed time, shells decide where it comes from."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    """Where a shell's time comes from: the simulator's `ManualClock`, the live shells'
    `server.clock.LoopClock` (the event loop's time, virtual in tests)."""

    def now(self) -> float:
        """Seconds since the clock's zero; never decreases, unaffected by wall-clock
        steps (NTP, DST). Core code never calls it: shells pass `now` in."""
        ...


class ManualClock:
    """Time that moves only when told: the simulator's clock, and tests'."""

    def __init__(self, start_s: float = 0.0) -> None:
        """`start_s`: the first reading, in seconds."""
        self._now = start_s

    def now(self) -> float:
        """The time it was last set or advanced to (`start_s` at first), in seconds."""
        return self._now

    def set(self, now: float) -> None:
        """Move to `now` (seconds); `ValueError` if that is earlier than the time set."""
        if now < self._now:
            raise ValueError(f"a clock cannot go back: {now} < {self._now}")
        self._now = now

    def advance(self, seconds: float) -> None:
        """Move on by `seconds`; `ValueError` if that is negative."""
        self.set(self._now + seconds)
