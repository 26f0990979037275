"""The live shell's clock: the event loop's time, starting at zero like the simulator's."""

from __future__ import annotations

import asyncio
import time


class LoopClock:
    """Seconds on the running event loop's clock (`loop.time()`), zero at the first reading.

    The asyncio shells (the batcher, the control loop, the worker link) sleep on the
    event loop, so they read time from it too: in production that is the monotonic
    clock; in tests the loop's time is virtual (looptime), sleeps take no real time and
    every deadline is exact. `origin_s` is the Unix time of the zero."""

    def __init__(self) -> None:
        self._zero: float | None = None
        self.origin_s = time.time()

    def now(self) -> float:
        loop_time = asyncio.get_running_loop().time()
        if self._zero is None:
            self._zero, self.origin_s = loop_time, time.time()
        return loop_time - self._zero
