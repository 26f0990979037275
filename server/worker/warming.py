"""The worker's warm-up: which batch-size buckets are warm, and the task that warms them.

`adaptive.warmup.WarmupTracker` holds the rules (the simulator's state machine); this
runs them live, fed the measured warm-ups. Raising the warm target warms the missing
buckets in the background, one after another, smallest first, each warm when its
measured warm-up (`Execution.warm`) finishes; lowering releases the buckets above the
target at once and cancels a warm-up in progress. A bucket that runs out of memory while
warming ends the warm-up, as does any other failure (logged and counted by `spawn`);
the batcher hears of each bucket warmed and of each end through the hooks it passes in,
and serves accordingly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from adaptive.clock import Clock
from adaptive.warmup import WarmupStatus, WarmupTracker
from server.tasks import BackgroundErrors, spawn
from server.worker.runner import Execution, OutOfMemory


class BucketWarmer:
    """The buckets a worker has warm (`status`), and the warm-up task that adds to them.

    warm_cap: the cap whose buckets are taken as warm at the start (0: none).
    run_size: the size a bucket is warmed at (the top bucket stops at the memory bound).
    on_warmed: called with a bucket and its measured seconds once it is warm.
    on_out_of_memory: called with a bucket that ran out of memory while warming (the
        warm-up has ended: what is warm stays warm).
    on_abandoned: called when a warm-up failed and ended.
    """

    def __init__(
        self,
        execution: Execution,
        clock: Clock,
        errors: BackgroundErrors,
        warm_cap: int,
        *,
        run_size: Callable[[int], int],
        on_warmed: Callable[[int, float], None],
        on_out_of_memory: Callable[[int, OutOfMemory], None],
        on_abandoned: Callable[[], None],
    ) -> None:
        self._execution, self._clock, self._errors = execution, clock, errors
        self._run_size = run_size
        self._on_warmed, self._on_out_of_memory = on_warmed, on_out_of_memory
        self._on_abandoned = on_abandoned
        self._tracker = WarmupTracker(None, warm_cap)
        self.status: WarmupStatus = self._tracker.status(0.0)
        self._task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # the current one and cancelled ones
        self._begun = False
        # The starting config's buckets are warm (until then the worker is not ready: it
        # would serve at a partial cap); later warm-ups ahead of a spike do not count.
        self.warmed_up = False

    def begin(self) -> None:
        """The worker serves from now: it is warmed up once nothing is warming."""
        self._begun = True
        self.warmed_up = not self.status.warming

    def request(self, target: int) -> None:
        """Warm every bucket up to `target`, and no more: start or cancel the warm-up to
        match."""
        self._change(lambda now: self._tracker.request(target, now))
        if not self.status.warming:
            self._cancel()  # released: a warm-up in progress is of no use
        elif self._task is None:
            self._task = spawn(self._warm(), "warm-up", self._errors, self._failed)
            self._tasks.add(self._task)
            self._task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel every warm-up and wait until they have stopped."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _warm(self) -> None:
        """Warm the tracker's pending buckets, smallest first, each marked warm when its
        measured warm-up finishes."""
        try:
            while self.status.warming:
                bucket = self.status.warming[0]
                try:
                    seconds = await self._execution.warm(self._run_size(bucket))
                except OutOfMemory as error:
                    self._change(self._tracker.abandon)
                    self._on_out_of_memory(bucket, error)
                    return
                self._change(lambda now, b=bucket: self._tracker.mark_warm(b, now))
                self._on_warmed(bucket, seconds)
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    def _failed(self, error: BaseException) -> None:
        """A warm-up failed (logged and counted by `spawn`): what is warm serves."""
        self._change(self._tracker.abandon)
        self._on_abandoned()

    def _change(self, change: Callable[[float], object]) -> None:
        now = self._clock.now()
        change(now)
        self.status = self._tracker.status(now)
        if self._begun and not self.status.warming:
            self.warmed_up = True
