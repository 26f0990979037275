"""The live control loop on Redis: workers follow its decisions; a standby takes over."""

import asyncio
import contextlib
import time

from redis_server import RedisProcess
from test_worker_link import until, worker

from adaptive.controller import Controller, ControllerSettings
from adaptive.guards import Guardrails
from adaptive.specs import PolicyContext, build_policy
from server.bus.redis_bus import RedisBus, connect
from server.control.loop import ControlLoop
from server.tasks import cancel_and_wait


def control_loop(bus: RedisBus, holder: str, lease_s: float = 3.0) -> ControlLoop:
    policy = build_policy("aimd:start=4,step=4,timeout=1ms", PolicyContext(0.1, 2))
    settings = ControllerSettings(
        pool="pool", tick_s=0.05, workers=2, guardrails=Guardrails(dwell_s=0.5)
    )
    return ControlLoop(Controller(policy, settings), bus, holder, lease_s)


async def keep_busy(batchers, stop: asyncio.Event):
    i = 0
    while not stop.is_set():
        await asyncio.gather(*(b.submit(i) for b in batchers for _ in range(16)))
        i += 1


@contextlib.asynccontextmanager
async def busy_pool(bus):
    """Two workers on the bus under steady load; on exit, load stops and they drain."""
    workers = [await worker(bus, f"w{i}") for i in range(2)]
    stop = asyncio.Event()
    load = [asyncio.create_task(keep_busy([b for b, _ in workers], stop))]
    try:
        yield [b for b, _ in workers]
    finally:
        stop.set()
        await asyncio.gather(*load)
        for batcher, link in workers:
            await link.stop()
            await batcher.drain()


def test_workers_follow_the_leaders_decisions_over_redis():
    server = RedisProcess()
    server.start()

    async def scenario():
        bus = RedisBus(connect(server.url))
        async with busy_pool(bus) as batchers:
            loop = control_loop(bus, "c1")
            running = asyncio.create_task(loop.run())
            await until(lambda: loop.controller.config_changes >= 2, timeout_s=10)
            await asyncio.sleep(0.2)
            await cancel_and_wait(running)
            stored = await bus.current_config("pool")
            decisions = await bus.decisions("pool", count=100)
            return loop, stored, [b.version for b in batchers], decisions

    try:
        loop, stored, worker_versions, decisions = asyncio.run(scenario())
    finally:
        server.stop()
    assert loop.state.leader and loop.state.workers_alive == 2
    assert stored.version == loop.state.version == loop.state.published_version
    assert worker_versions == [stored.version] * 2
    assert decisions and decisions[-1]["chosen"]["max_batch"] == stored.config.max_batch_size


def test_a_standby_takes_over_within_two_leases_and_versions_never_go_back():
    server = RedisProcess()
    server.start()
    lease_s = 0.3

    async def scenario():
        bus = RedisBus(connect(server.url))
        workers = [await worker(bus, f"w{i}") for i in range(2)]
        # Two controller processes: each its own connection.
        first = control_loop(RedisBus(connect(server.url)), "c1", lease_s)
        second = control_loop(RedisBus(connect(server.url)), "c2", lease_s)
        tasks = {"c1": asyncio.create_task(first.run()), "c2": asyncio.create_task(second.run())}
        stop = asyncio.Event()
        background = [asyncio.create_task(keep_busy([b for b, _ in workers], stop))]
        versions = []

        async def watch():
            while not stop.is_set():
                current = await bus.current_config("pool")
                versions.append(current.version if current else 0)
                await asyncio.sleep(0.02)

        background.append(asyncio.create_task(watch()))
        loops = {"c1": first, "c2": second}

        def leading():
            return next((name for name, loop in loops.items() if loop.state.leader), None)

        await until(lambda: leading() and loops[leading()].controller.config_changes >= 1, 10)
        dead = leading()
        standby = loops["c2" if dead == "c1" else "c1"]
        died = time.monotonic()
        await cancel_and_wait(tasks[dead], poll_s=0.001)  # the leader dies without a word
        try:
            await until(lambda: standby.state.leader, timeout_s=5)
        except AssertionError:
            raise AssertionError(
                f"{standby.state} leader={await bus.leader('pool')} dead={dead} "
                f"ttl={await bus.client.pttl(bus.key('pool', 'leader'))}"
            ) from None
        takeover_s = time.monotonic() - died
        await asyncio.sleep(0.5)  # the new leader runs the pool for a while
        adopted = (standby.state.version, loops[dead].state.published_version)
        stop.set()
        await asyncio.gather(*background)
        for task in tasks.values():
            await cancel_and_wait(task)
        for batcher, link in workers:
            await link.stop()
            await batcher.drain()
        return takeover_s, versions, adopted

    try:
        takeover_s, versions, (second_version, first_published) = asyncio.run(scenario())
    finally:
        server.stop()
    assert takeover_s <= 2 * lease_s
    assert versions == sorted(versions) and versions[-1] > 1
    assert second_version >= first_published  # the standby adopted the config in force


def test_a_new_leader_on_a_redis_that_lost_its_data_publishes_above_what_workers_run():
    server = RedisProcess()
    server.start()

    async def scenario():
        bus = RedisBus(connect(server.url))
        async with busy_pool(bus) as batchers:
            first = control_loop(bus, "c1")
            running = asyncio.create_task(first.run())
            await until(lambda: first.controller.config_changes >= 2, timeout_s=10)
            await until(lambda: all(b.version == first.state.version for b in batchers))
            before = first.state.version
            await cancel_and_wait(running)
            await bus.client.flushall()  # Redis restarted empty: no config, no lease
            second = control_loop(bus, "c2")  # a fresh controller: its own version is 1
            running = asyncio.create_task(second.run())
            await until(lambda: second.state.leader and second.state.published_version > 0)
            await until(lambda: all(b.version == second.state.published_version for b in batchers))
            stored = await bus.current_config("pool")
            await cancel_and_wait(running)
            return before, stored.version

    try:
        before, after = asyncio.run(scenario())
    finally:
        server.stop()
    assert after > before  # above what the workers ran, so they applied it
