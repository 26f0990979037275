"""Supervised asyncio tasks for the live shells: no failure is discarded, none hangs.

asyncio keeps a task's exception until someone asks for it, and a task nobody awaits
fails in silence (at best a "never retrieved" line at exit). Every long-lived task of a
live process (a worker's dispatch loop and warm-up, a pool member's report and config
loops, an engine adapter's) is started with `spawn`, so a failure is logged with its
traceback at once, counted by task name (`tidal_worker_background_errors_total{task}`)
and handed to the owner's `on_failure`, which decides what the failure means
(readiness, an abandoned warm-up). `cancel_and_wait` stops a task that talks to Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("tidal")


class BackgroundErrors:
    """Failures of background tasks by task name: logged with the traceback, counted."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def record(self, task: str, error: BaseException) -> None:
        self.counts[task] = self.counts.get(task, 0) + 1
        log.error("background task %s failed: %s", task, error, exc_info=error)


def spawn(
    coroutine: Coroutine[Any, Any, None],
    name: str,
    errors: BackgroundErrors,
    on_failure: Callable[[BaseException], None] | None = None,
) -> asyncio.Task:
    """Start `coroutine` as a task whose failure (not its cancellation) is recorded in
    `errors` and passed to `on_failure` as soon as it happens."""
    task = asyncio.create_task(coroutine, name=name)

    def done(finished: asyncio.Task) -> None:
        if finished.cancelled() or finished.exception() is None:
            return
        error = finished.exception()
        errors.record(name, error)
        if on_failure is not None:
            on_failure(error)

    task.add_done_callback(done)
    return task


async def cancel_and_wait(task: asyncio.Task, poll_s: float = 0.5) -> None:
    """Cancel `task` until it is done. redis-py can swallow a cancellation that lands
    mid-command (the task then carries on to its next await), so one `cancel()` and an
    `await` may wait forever; this insists."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=poll_s)
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log it as never retrieved
