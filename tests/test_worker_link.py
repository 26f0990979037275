"""Workers on a pool's bus: config propagation, and fail-static when the bus goes away.

The link's logic (report instants, measured windows, backoff, unsent windows, config
sync) runs in virtual time on the in-process `LocalPoolBus`, with an outage switch; two
tests run it on a real Redis, stopped and restarted, as proof of the real thing.
"""

import asyncio
import logging
import threading
import time

from redis.exceptions import ConnectionError as RedisConnectionError
from redis_server import RedisProcess
from test_control_loop_shell import control_loop
from test_worker_batcher import EchoRunner, at, cold, virtual
from virtual_time import run_virtual

from adaptive.bus import VersionedConfig
from adaptive.config import BatchConfig
from server.bus.local import LocalPoolBus
from server.bus.redis_bus import RedisBus, connect
from server.worker.batching import DynamicBatcher
from server.worker.link import WorkerLink


class OutageBus(LocalPoolBus):
    """The in-process bus with a switch: while `down`, every call raises redis-py's
    ConnectionError, and open subscriptions break, as they do when Redis stops."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self._queues: list[asyncio.Queue] = []

    def stop(self) -> None:
        self.down = True
        for queue in self._queues:
            queue.put_nowait(None)  # wakes the listener, which then raises

    def _check(self) -> None:
        if self.down:
            raise RedisConnectionError("bus down")

    async def current_config(self, pool):
        self._check()
        return await super().current_config(pool)

    async def subscribe_configs(self, pool):
        self._check()
        notices = await super().subscribe_configs(pool)
        self._queues.append(notices._queue)
        outer = self

        class Breaking:
            async def listen(self):
                async for version in notices.listen():
                    outer._check()
                    yield version

            async def aclose(self):
                await notices.aclose()

        return Breaking()

    async def publish_worker_stats(self, pool, stats, at_s=None):
        self._check()
        await super().publish_worker_stats(pool, stats, at_s)

    async def heartbeat(self, pool, worker, info, ttl_s):
        self._check()
        await super().heartbeat(pool, worker, info, ttl_s)


async def virtual_worker(bus, name="w0"):
    batcher = virtual(cold(), BatchConfig(4, 0.0), service_s=0.0625, warm_at_start=False)
    await batcher.start()
    link = WorkerLink(batcher, bus, "pool", name, interval_s=1.0)
    link.start()
    return batcher, link


def test_reports_fall_due_every_interval_and_newer_configs_apply_on_notice():
    async def scenario():
        bus = LocalPoolBus()
        batcher, link = await virtual_worker(bus)
        await at(0.5)
        served = await asyncio.gather(*(batcher.submit(i) for i in range(8)))
        await at(2.25)
        await bus.publish_config("pool", VersionedConfig(3, BatchConfig(16, 0.125)))
        await asyncio.sleep(0)  # the notice is delivered on the next loop turn
        applied = (asyncio.get_running_loop().time(), batcher.version, batcher.config)
        await bus.publish_config("pool", VersionedConfig(2, BatchConfig(2, 0.0)))  # older
        joiner, joined = await virtual_worker(bus, "w1")
        await at(3.5)
        info = dict(await bus.workers_alive("pool"))
        await joined.stop()
        await link.stop()
        await batcher.drain()
        await joiner.drain()
        stored, _, _ = await bus.read_worker_stats("pool")
        return served, applied, joiner.version, info, stored, batcher.config

    served, applied, joiner_version, info, stored, config = run_virtual(scenario())
    assert [s.output for s in served] == [2 * i for i in range(8)]
    assert applied == (2.25, 3, BatchConfig(16, 0.125))
    assert config == BatchConfig(16, 0.125) and joiner_version == 3  # the joiner read it
    assert sorted(info) == ["w0", "w1"] and info["w0"]["config_version"] == 3
    w0 = [s for s in stored if s.worker == "w0"]
    # Windows due at 1, 2, 3 s on the clock, then the last partial one at stop (3.5 s).
    assert [s.window_s for s in w0] == [1.0, 1.0, 1.0, 0.5]
    assert [s.arrivals for s in w0] == [8, 0, 0, 0] and sum(s.completed for s in w0) == 8
    assert [s.config_version for s in w0] == [0, 0, 3, 3]


def test_the_link_serves_through_an_outage_and_sends_the_held_windows_when_it_returns(caplog):
    async def scenario():
        bus = OutageBus()
        batcher, link = await virtual_worker(bus)
        timeline = []
        await at(0.5)
        timeline.append(link.connected)
        first = await asyncio.gather(*(batcher.submit(i) for i in range(10)))
        await at(2.5)
        bus.stop()
        await at(3.0)
        timeline.append(link.connected)
        during = await asyncio.gather(*(batcher.submit(i) for i in range(10, 30)))
        await at(5.5)
        held = len(link.unsent)
        bus.down = False
        await at(6.3)  # backoff: retries at 2.55, 2.65, 2.85, 3.35, 4.35, then 6.35 s
        timeline.append(link.connected)
        await at(6.375)
        timeline.append(link.connected)
        await bus.publish_config("pool", VersionedConfig(7, BatchConfig(8, 0.0)))
        await asyncio.sleep(0)
        version = batcher.version
        await link.stop()
        await batcher.drain()
        stored, _, _ = await bus.read_worker_stats("pool")
        return first + during, timeline, held, version, stored, batcher.errors.counts

    with caplog.at_level(logging.WARNING, logger="tidal.worker"):
        served, timeline, held, version, stored, errors = run_virtual(scenario())
    assert [s.output for s in served] == [2 * i for i in range(30)]
    assert timeline == [True, False, False, True]
    assert held == 3  # the windows due at 3, 4 and 5 s, kept for later
    assert version == 7
    assert [s.window_s for s in stored] == [1.0] * 6 + [0.375]  # nothing lost, nothing twice
    assert sum(s.arrivals for s in stored) == 30 == sum(s.completed for s in stored)
    assert errors == {}  # an outage is not a bug
    assert sum("unreachable" in r.message for r in caplog.records) == 1  # said once


def test_a_bug_in_a_link_loop_is_logged_counted_and_the_loop_goes_on(caplog):
    class Buggy(LocalPoolBus):
        calls = 0

        async def heartbeat(self, pool, worker, info, ttl_s):
            Buggy.calls += 1
            if Buggy.calls == 2:
                raise TypeError("a bug, not an outage")
            await super().heartbeat(pool, worker, info, ttl_s)

    async def scenario():
        bus = Buggy()
        batcher, link = await virtual_worker(bus)
        await at(4.5)
        await link.stop()
        await batcher.drain()
        stored, _, _ = await bus.read_worker_stats("pool")
        return len(stored), batcher.errors.counts

    with caplog.at_level(logging.ERROR, logger="tidal.worker"):
        windows, errors = run_virtual(scenario())
    assert windows == 5 and errors == {"link-report": 1}
    assert any(r.exc_info and r.exc_info[0] is TypeError for r in caplog.records)


async def worker(bus, name):
    batcher = DynamicBatcher(EchoRunner(base_s=0.001), BatchConfig(4, 0.001), warm_at_start=False)
    await batcher.start()
    link = WorkerLink(batcher, bus, "pool", name, interval_s=0.05, heartbeat_ttl_s=0.5)
    link.start()
    return batcher, link


async def until(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_a_new_config_reaches_every_worker_fast_and_a_joiner_reads_it():
    server = RedisProcess()
    server.start()

    async def scenario():
        bus = RedisBus(connect(server.url))
        workers = [await worker(bus, f"w{i}") for i in range(2)]
        await until(lambda: all(link.connected for _, link in workers))
        sent = time.monotonic()
        await bus.publish_config("pool", VersionedConfig(2, BatchConfig(16, 0.002)))
        await until(lambda: all(b.version == 2 for b, _ in workers))
        propagation_s = time.monotonic() - sent
        late = await worker(bus, "host:8001")
        await until(lambda: late[0].version == 2)
        await asyncio.sleep(0.15)  # a couple of heartbeat intervals
        alive = sorted(await bus.workers_alive("pool"))
        for batcher, link in [*workers, late]:
            await link.stop()
            await batcher.drain()
        return propagation_s, [b.config for b, _ in [*workers, late]], alive

    try:
        propagation_s, configs, alive = asyncio.run(scenario())
    finally:
        server.stop()
    assert propagation_s < 0.1
    assert configs == [BatchConfig(16, 0.002)] * 3
    assert alive == ["host:8001", "w0", "w1"]


def test_workers_keep_serving_when_redis_stops_and_resynchronise_when_it_returns():
    server = RedisProcess()
    server.start()

    async def scenario():
        bus = RedisBus(connect(server.url))
        batcher, link = await worker(bus, "w0")
        await until(lambda: link.connected)
        first = await asyncio.gather(*(batcher.submit(i) for i in range(50)))
        server.stop()
        await until(lambda: not link.connected)
        during = await asyncio.gather(*(batcher.submit(i) for i in range(50, 100)))
        await asyncio.sleep(0.2)  # several report windows with Redis away
        server.start()  # a fresh, empty Redis on the same port
        await until(lambda: link.connected)
        await bus.publish_config("pool", VersionedConfig(7, BatchConfig(8, 0.0)))
        await until(lambda: batcher.version == 7)
        await link.stop()
        await batcher.drain()
        stored, _, _ = await bus.read_worker_stats("pool")
        return first + during, stored

    try:
        served, stored = asyncio.run(scenario())
    finally:
        server.stop()
    assert [s.output for s in served] == [2 * i for i in range(100)]
    # The restarted Redis is empty: what it holds is everything since it came back,
    # including the windows held while it was away (the 50 served during the outage).
    assert sum(s.arrivals for s in stored) >= 50


def test_a_worker_that_begins_to_drain_leaves_the_pool_at_once_and_still_reports():
    async def scenario():
        bus = LocalPoolBus()
        batcher, link = await virtual_worker(bus)
        await at(2.5)
        before = await bus.workers_alive("pool")
        served = asyncio.create_task(batcher.submit(1))  # in the queue as the drain begins
        await link.leave()
        gone = await bus.workers_alive("pool")
        await at(4.5)  # two report intervals: no heartbeat brings it back
        still_gone = await bus.workers_alive("pool")
        await batcher.drain()
        await link.stop()
        stored, _, _ = await bus.read_worker_stats("pool")
        return before, gone, still_gone, await served, stored

    before, gone, still_gone, served, stored = run_virtual(scenario())
    assert list(before) == ["w0"] and gone == {} and still_gone == {}
    assert served.output == 2  # what it held was answered
    assert sum(s.completed for s in stored) == 1  # and reported after leaving


def test_a_worker_warming_its_starting_sizes_beats_as_not_ready_until_they_are_warm():
    async def scenario():
        bus = LocalPoolBus()
        batcher = virtual(cold(), BatchConfig(4, 0.0), service_s=0.0625, warm_s=1.0)
        await batcher.start()  # buckets 1, 2 and 4 warm one after another, done at 3 s
        other, warm = await virtual_worker(bus, "w1")  # warm from the start
        await at(0.5)
        link = WorkerLink(batcher, bus, "pool", "w0", interval_s=1.0)
        link.start()  # beats at 1.5, 2.5, 3.5 s: between the warm-ups, never at once
        controller = control_loop(bus)
        seen = {}
        for instant in (1.75, 2.75, 3.75):
            await at(instant)
            await controller._read()
            beat = (await bus.workers_alive("pool"))["w0"]
            state = controller.state
            seen[instant] = (beat["ready"], beat["not_ready"], state.workers_ready, state.not_ready)
        served = await batcher.submit(5)  # served while it warmed, and after
        await warm.stop()
        await link.stop()
        await batcher.drain()
        await other.drain()
        return seen, controller.state.workers_alive, served.output

    seen, alive, output = run_virtual(scenario())
    warming = "warming up (batch sizes warm so far: {0}; serving cap {1})"
    first, second = warming.format(1, 1), warming.format("1, 2", 2)
    assert seen[1.75] == (False, first, 1, {"w0": first})
    assert seen[2.75] == (False, second, 1, {"w0": second})
    assert seen[3.75] == (True, None, 2, {})
    assert alive == 2 and output == 10


async def readiness_seen(controller) -> tuple[int, int, dict[str, str]]:
    """What the controller counts after reading the pool: alive, ready, and why not."""
    await controller._read()
    state = controller.state
    return state.workers_alive, state.workers_ready, dict(state.not_ready)


class Frontends:
    """Front ends as the worker's readiness sees them (`server.worker.readiness.Frontends`):
    the test connects them one by one, as a starting FrontendPool's processes do."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.connected = 0

    @property
    def ready(self) -> bool:
        return self.connected == self.count

    def summary(self) -> list[dict]:
        return [{"connected": i < self.connected} for i in range(self.count)]


def test_a_worker_beats_as_not_ready_until_every_front_end_is_connected():
    """As its /readyz answers: the controller counts it alive, and ready only once the
    front ends that take its port are all up."""

    async def scenario():
        bus = LocalPoolBus()
        batcher = virtual(cold(), BatchConfig(4, 0.0), service_s=0.0625, warm_at_start=False)
        await batcher.start()
        frontends = Frontends(2)
        link = WorkerLink(batcher, bus, "pool", "w0", interval_s=1.0, frontends=frontends)
        link.start()  # beats at 0, 1, 2, 3 s
        controller = control_loop(bus)
        seen = []
        for connected in (0, 1, 2):  # one more connected before each beat from 1 s
            frontends.connected = connected
            await at(1.25 + connected)
            seen.append(await readiness_seen(controller))
        await link.stop()
        await batcher.drain()
        return seen

    starting = "front ends starting ({} of 2 connected)"
    assert run_virtual(scenario()) == [
        (1, 0, {"w0": starting.format(0)}),
        (1, 0, {"w0": starting.format(1)}),
        (1, 1, {}),
    ]


def test_a_worker_whose_dispatch_loop_died_beats_as_not_ready():
    async def scenario():
        bus = LocalPoolBus()
        batcher, link = await virtual_worker(bus)
        await at(1.5)
        ready_before = (await bus.workers_alive("pool"))["w0"]["ready"]

        def broken_hook(_late_s):
            raise ZeroDivisionError("a bug in a metrics hook")

        batcher.on_dispatch = broken_hook
        served = asyncio.create_task(batcher.submit(1))  # its batch launches, then the loop dies
        await at(2.5)
        beat = (await bus.workers_alive("pool"))["w0"]
        await served
        await link.stop()
        await asyncio.wait_for(batcher.drain(), 5)
        return ready_before, beat

    ready_before, beat = run_virtual(scenario())
    assert ready_before is True
    assert beat["ready"] is False and beat["not_ready"].startswith("the dispatch loop died")


def test_on_redis_a_controller_counts_a_warming_worker_alive_but_not_ready():
    class HeldWarmUp(EchoRunner):
        """Each bucket's warm-up waits until the test lets it finish."""

        def __init__(self) -> None:
            super().__init__(base_s=0.001)
            self.release = threading.Event()

        def warm(self, size):
            self.release.wait(10)
            return super().warm(size)

    server = RedisProcess()
    server.start()

    async def scenario():
        bus = RedisBus(connect(server.url))
        runner = HeldWarmUp()
        batcher = DynamicBatcher(runner, BatchConfig(4, 0.001))
        await batcher.start()
        link = WorkerLink(batcher, bus, "pool", "new", interval_s=0.05, heartbeat_ttl_s=0.5)
        link.start()
        # A worker of an older release: its heartbeat does not say whether it is ready.
        await bus.heartbeat("pool", "old", {"config_version": 0}, ttl_s=30.0)
        controller = control_loop(bus)
        seen = []
        for release in (False, True):
            if release:
                runner.release.set()
            await until(lambda r=release: link.info()["ready"] is r)
            await asyncio.sleep(0.15)  # a couple of beats
            seen.append(await readiness_seen(controller))
        await link.stop()
        await batcher.drain()
        return seen

    try:
        warming, warm = asyncio.run(scenario())
    finally:
        server.stop()
    assert warming == (2, 1, {"new": "warming up (batch sizes warm so far: none; serving cap 1)"})
    assert warm == (2, 2, {})
