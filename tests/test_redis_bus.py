"""The Redis bus against a real redis-server on a free port."""

import asyncio
import json

import pytest
import redis.exceptions
from redis_server import redis_server

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.config import BatchConfig
from server.bus.redis_bus import RedisBus, connect
from server.bus.wire import MalformedStats, decode_stats, encode_stats


@pytest.fixture(scope="module")
def url():
    with redis_server() as address:
        yield address


def stats(worker: str, arrivals: int) -> WorkerStats:
    return WorkerStats(
        worker=worker,
        window_s=1.0,
        arrivals=arrivals,
        completed=arrivals,
        shed=0,
        latency_buckets=((400, arrivals),),
        latency_sum_s=0.01 * arrivals,
        batch_sizes=((4, arrivals // 4),),
        busy_s=0.1,
        queue_depth=2,
        max_batch_size=8,
        warmed_buckets=(1, 2, 4, 8),
        config_version=3,
    )


def test_config_versions_never_go_backwards_and_changes_are_announced(url):
    async def scenario():
        bus = RedisBus(connect(url), prefix="t1")
        notices = await bus.subscribe_configs("pool")
        accepted = [
            await bus.publish_config("pool", VersionedConfig(v, BatchConfig(8 * v, 0.001 * v)))
            for v in (2, 1, 3, 3)
        ]
        current = await bus.current_config("pool")
        seen = []
        while len(seen) < 2:
            message = await notices.get_message(timeout=1.0)
            if message:
                seen.append(message["data"])
        await notices.aclose()
        return accepted, current, seen

    accepted, current, seen = asyncio.run(scenario())
    assert accepted == [True, False, True, False]
    assert current == VersionedConfig(3, BatchConfig(24, 0.003))
    assert seen == ["2", "3"]


def test_worker_stats_round_trip_and_per_second_arrivals(url):
    async def scenario():
        bus = RedisBus(connect(url), prefix="t2")
        await bus.publish_worker_stats("pool", stats("a", 40), at_s=1000.2)
        await bus.publish_worker_stats("pool", stats("b", 60), at_s=1000.7)
        await bus.publish_worker_stats("pool", stats("a", 8), at_s=1001.1)
        first, cursor, _ = await bus.read_worker_stats("pool")
        await bus.publish_worker_stats("pool", stats("b", 1), at_s=1002.0)
        later, _, _ = await bus.read_worker_stats("pool", cursor)
        await bus.publish_worker_stats("pool", stats("a", 5), at_s=3599.9)  # hours 0 and 1
        await bus.publish_worker_stats("pool", stats("a", 7), at_s=3600.0)
        ttl_s = await bus.client.ttl("t2:pool:arrivals:1")
        return (
            first,
            later,
            await bus.arrivals_per_second("pool", 1000, 1002),
            await bus.arrivals_per_second("pool", 1001, 3601),
            ttl_s,
        )

    first, later, arrivals, across_hours, ttl_s = asyncio.run(scenario())
    assert first == [stats("a", 40), stats("b", 60), stats("a", 8)]
    assert later == [stats("b", 1)]
    assert arrivals == {1000: 100, 1001: 8}
    assert across_hours == {1001: 8, 1002: 1, 3599: 5, 3600: 7}
    assert 8 * 86_400 < ttl_s <= 8 * 86_400 + 3600  # history trims itself


def test_heartbeats_expire_and_the_lease_passes_on(url):
    async def scenario():
        bus = RedisBus(connect(url), prefix="t3")
        await bus.heartbeat("pool", "w1", {"version": 3}, ttl_s=0.3)
        await bus.heartbeat("pool", "w2", {"version": 3}, ttl_s=5)
        alive_then = sorted(await bus.workers_alive("pool"))
        first = await bus.acquire_or_renew_lease("pool", "c1", ttl_s=0.3)
        second = await bus.acquire_or_renew_lease("pool", "c2", ttl_s=0.3)
        renewed = await bus.acquire_or_renew_lease("pool", "c1", ttl_s=0.3)
        await asyncio.sleep(0.45)
        alive_now = sorted(await bus.workers_alive("pool"))
        taken_over = await bus.acquire_or_renew_lease("pool", "c2", ttl_s=0.3)
        return alive_then, alive_now, (first, second, renewed, taken_over), await bus.leader("pool")

    alive_then, alive_now, lease, leader = asyncio.run(scenario())
    assert alive_then == ["w1", "w2"] and alive_now == ["w2"]
    assert lease == (True, False, True, True) and leader == "c2"


def test_a_worker_that_leaves_is_gone_at_once(url):
    async def scenario():
        bus = RedisBus(connect(url), prefix="t3b")
        await bus.heartbeat("pool", "w1", {"version": 3}, ttl_s=30)
        await bus.heartbeat("pool", "w2", {"version": 3}, ttl_s=30)
        await bus.leave("pool", "w1")
        await bus.leave("pool", "never-joined")  # harmless
        return sorted(await bus.workers_alive("pool"))

    assert asyncio.run(scenario()) == ["w2"]


def test_decision_log_is_capped_and_returns_the_newest(url):
    async def scenario():
        bus = RedisBus(connect(url), prefix="t4")
        for i in range(5):
            await bus.record_decision("pool", {"at_s": i, "reason": f"r{i}"})
        return await bus.decisions("pool", count=3)

    assert [r["at_s"] for r in asyncio.run(scenario())] == [2, 3, 4]


def test_password_urls_work_and_a_wrong_password_is_refused():
    with redis_server("--requirepass", "s3cret") as url:

        async def scenario(address):
            bus = RedisBus(connect(address))
            await bus.publish_config("pool", VersionedConfig(1, BatchConfig(8, 0.01)))
            return await bus.current_config("pool")

        assert asyncio.run(scenario(url)).version == 1
        wrong = url.replace("s3cret", "nope")
        with pytest.raises(redis.exceptions.AuthenticationError):
            asyncio.run(scenario(wrong))


def test_a_malformed_or_newer_schema_stats_entry_is_skipped_or_read_and_never_stops_reading(url):
    """Defect 3: parsing failed before the cursor advanced, so one bad entry stopped the
    control loop for good; a newer worker's extra field did the same."""

    async def scenario():
        bus = RedisBus(connect(url), prefix="t-wire")
        key = bus.key("pool", "stats")
        await bus.publish_worker_stats("pool", stats("a", 10))
        await bus.client.xadd(key, {"stats": "{not json"})
        await bus.client.xadd(key, {"stats": '{"schema": 1, "worker": "b"}'})  # fields missing
        newer = json.loads(encode_stats(stats("c", 30)))
        newer.update(schema=2, gpu_memory_bytes=123)  # a field this release does not know
        await bus.client.xadd(key, {"stats": json.dumps(newer)})
        first, cursor, malformed = await bus.read_worker_stats("pool")
        await bus.publish_worker_stats("pool", stats("d", 40))
        later, _, again = await bus.read_worker_stats("pool", cursor)
        return first, malformed, later, again

    first, malformed, later, again = asyncio.run(scenario())
    assert [(s.worker, s.arrivals) for s in first] == [("a", 10), ("c", 30)]
    assert malformed == 2
    assert [s.worker for s in later] == ["d"] and again == 0  # past the bad ones for good


def test_the_wire_format_round_trips_and_names_what_is_wrong():
    assert decode_stats(encode_stats(stats("a", 5))) == stats("a", 5)
    with pytest.raises(MalformedStats, match="missing field"):
        decode_stats('{"worker": "a"}')
    broken = json.loads(encode_stats(stats("a", 5)))
    broken["arrivals"] = -3
    with pytest.raises(MalformedStats, match="'arrivals'"):
        decode_stats(json.dumps(broken))
