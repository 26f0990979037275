"""Workers on the Redis bus: config propagation, and fail-static when Redis goes away."""

import asyncio
import time

from redis_server import RedisProcess
from test_worker_batcher import EchoRunner

from adaptive.bus import VersionedConfig
from adaptive.config import BatchConfig
from server.bus.redis_bus import RedisBus, connect
from server.worker.batching import DynamicBatcher
from server.worker.link import WorkerLink


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
