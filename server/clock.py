"""The live shells' clocks, both starting at zero like the simulator's.

`LoopClock` is the event loop's time: the shells that sleep on the loop (the control
loop, the in-process bus, an engine's pool member) read it, and under looptime it is virtual, so
their tests run at exact instants. `MonotonicClock` is `time.perf_counter()`: what the
worker times its requests and batches with, because uvloop's `loop.time()` is libuv's
millisecond clock, cached once per loop iteration (113 of 200 batches of 0.2 ms measured
exactly 0.0 on it); its tests pass a `LoopClock` instead, to run in virtual time.
"""

from __future__ import annotations

import asyncio
import time


class LoopClock:
    """Seconds on the running event loop's clock (`loop.time()`), zero at the first reading.

    The asyncio shells (the control loop, the in-process bus, an engine's pool member)
    sleep on the event loop, so they read time from it too: in production that is the monotonic
    clock (on uvloop, in whole milliseconds); in tests the loop's time is virtual
    (looptime), sleeps take no real time and every deadline is exact. `origin_s` is the
    Unix time of the zero."""

    def __init__(self) -> None:
        self._zero: float | None = None
        self.origin_s = time.time()

    def now(self) -> float:
        loop_time = asyncio.get_running_loop().time()
        if self._zero is None:
            self._zero, self.origin_s = loop_time, time.time()
        return loop_time - self._zero


class MonotonicClock:
    """Seconds on `time.perf_counter()` (monotonic, sub-microsecond), zero at the first
    reading: the worker's clock in production. It runs at the loop's rate, so deadlines
    read on it and slept for on the loop agree; it is never virtual, so a test on a
    virtual-time loop passes the batcher a `LoopClock`."""

    def __init__(self) -> None:
        self._zero: float | None = None

    def now(self) -> float:
        reading = time.perf_counter()
        if self._zero is None:
            self._zero = reading
        return reading - self._zero
