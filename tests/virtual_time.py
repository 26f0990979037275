"""Run a coroutine on an event loop whose time is virtual (looptime).

Sleeps, timeouts and `call_later` take no real time: the loop jumps to the next timer
whenever nothing is ready, so a shell driven by `server.clock.LoopClock` is tested at
exact instants, however busy the machine. Work in threads or sockets takes zero loop
time, so tests that need real time (a real Redis, a real model) do not belong here.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import looptime

T = TypeVar("T")


def run_virtual(coro: Coroutine[Any, Any, T], start_s: float = 0.0) -> T:
    loop = looptime.new_event_loop(start=start_s)
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
