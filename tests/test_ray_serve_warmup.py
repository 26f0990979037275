"""A `@tidal_batch` warm-up hook that is a plain `def` runs on a thread, and a thread
cannot be stopped: when its warm-up is cancelled (the cap lowered, the replica leaving)
nothing of it may run on. The cancelled warm-up is joined: `close()` returns only once
the hook has returned, and a later warm-up never runs beside one still finishing.

In process, no Ray: the engine with Ray's setters recorded, the hook on real threads.
"""

from __future__ import annotations

import asyncio
import threading

from adaptive.bus import VersionedConfig
from adaptive.config import BatchConfig
from server.engines.ray_serve import MonotonicClock, RayServeEngine
from server.engines.ray_serve_engine import warm_hook
from server.tasks import BackgroundErrors

THREAD_WAIT_S = 5.0  # a bound on waits for the hook's thread, never reached when all is well


class Knobs:
    """What Ray's batch wrapper offers, recorded."""

    max_batch_size: int | None = None

    def set_max_batch_size(self, value: int) -> None:
        self.max_batch_size = value

    def set_batch_wait_timeout_s(self, value: float) -> None:
        pass


class BlockingWarmup:
    """A sync warm-up hook whose bucket 8 holds its thread until released; it counts the
    hook's runs in flight, on every thread."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered_8 = threading.Event()
        self.finished_8 = threading.Event()
        self.calls_8 = 0
        self.running = 0
        self.most_running = 0
        self._lock = threading.Lock()

    def __call__(self, instance: object, bucket: int) -> None:
        with self._lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            if bucket == 8:
                self.calls_8 += 1
        try:
            if bucket == 8:
                self.entered_8.set()
                self.release.wait(THREAD_WAIT_S)
                self.finished_8.set()
        finally:
            with self._lock:
                self.running -= 1


def engine_with(hook: BlockingWarmup) -> tuple[RayServeEngine, Knobs]:
    knobs = Knobs()
    engine = RayServeEngine(
        knobs,
        "w0",
        BatchConfig(4, 0.005),
        1,
        lambda: 32,
        warm_hook(hook, object()),
        MonotonicClock(),
        BackgroundErrors(),
    )
    return engine, knobs


async def warming_8(hook: BlockingWarmup) -> tuple[RayServeEngine, Knobs]:
    """An engine serving 4, warming bucket 8 on a thread that holds it."""
    engine, knobs = engine_with(hook)
    engine.begin()
    await engine.warmed()
    await engine.apply(VersionedConfig(1, BatchConfig(8, 0.005)))
    assert await asyncio.to_thread(hook.entered_8.wait, THREAD_WAIT_S)
    return engine, knobs


def test_closing_waits_for_a_sync_warm_up_on_its_thread():
    async def scenario() -> None:
        hook = BlockingWarmup()
        engine, _ = await warming_8(hook)
        closing = asyncio.create_task(engine.close())
        await asyncio.wait({closing}, timeout=0.2)
        closed_while_warming = closing.done()
        hook.release.set()
        await closing
        assert not closed_while_warming, "close() returned while the hook still ran"
        assert hook.finished_8.is_set() and hook.running == 0

    asyncio.run(scenario())


def test_a_released_sync_warm_up_never_runs_beside_the_next():
    async def scenario() -> None:
        hook = BlockingWarmup()
        engine, knobs = await warming_8(hook)
        await engine.apply(VersionedConfig(2, BatchConfig(2, 0.005)))  # releases 8
        assert knobs.max_batch_size == 2
        await engine.apply(VersionedConfig(3, BatchConfig(8, 0.005)))  # wants 8 again
        for _ in range(20):  # the loop's turns in which a second run would start
            await asyncio.sleep(0)
        await asyncio.to_thread(hook.release.wait, 0.2)
        assert hook.calls_8 == 1, "bucket 8 warmed again while its first warm-up ran on"
        hook.release.set()
        await engine.warmed()
        assert hook.calls_8 == 2 and hook.most_running == 1
        assert knobs.max_batch_size == 8 and engine.status()["warmed_buckets"] == [1, 2, 4, 8]
        await engine.close()

    asyncio.run(scenario())
