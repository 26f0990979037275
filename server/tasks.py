"""Stopping asyncio tasks that talk to Redis."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task, poll_s: float = 0.5) -> None:
    """Cancel `task` until it is done. redis-py can swallow a cancellation that lands
    mid-command (the task then carries on to its next await), so one `cancel()` and an
    `await` may wait forever; this insists."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=poll_s)
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved
