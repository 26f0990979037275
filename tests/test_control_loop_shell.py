"""The live control loop's shell logic in virtual time: leadership, failover, versions,
pools without workers, failures that must be loud. The bus is the in-process
`LocalPoolBus`, whose heartbeats and leases expire on the event loop's (virtual) clock,
so every assertion is on exact instants, however busy the machine.
"""

import asyncio
import contextlib
import logging

from virtual_time import run_virtual

from adaptive.bus import WorkerStats
from adaptive.config import BatchConfig
from adaptive.controller import Controller, ControllerSettings, Override
from adaptive.fleet import FleetLimits
from adaptive.guards import Guardrails
from adaptive.policy import Decision
from adaptive.specs import PolicyContext, build_policy
from server.bus.local import LocalPoolBus
from server.control.loop import ControlLoop
from server.tasks import cancel_and_wait

POOL = "pool"


def control_loop(bus, holder="c1", spec="aimd:start=4,step=4,timeout=1ms", lease_s=3.0):
    policy = build_policy(spec, PolicyContext(0.1, 2))
    settings = ControllerSettings(pool=POOL, workers=2, guardrails=Guardrails(dwell_s=5.0))
    return ControlLoop(Controller(policy, settings), bus, holder, lease_s)


def stats(worker: str, version: int, arrivals: int = 200) -> WorkerStats:
    """A busy worker's second: full batches of its cap, quick latencies."""
    return WorkerStats(
        worker, 1.0, arrivals, arrivals, 0, ((40, arrivals),), 0.5, ((8, arrivals // 8),),
        0.6, 0, 8, (1, 2, 4, 8), version,
    )  # fmt: skip


async def worker(bus, name: str, beats: asyncio.Event | None = None) -> None:
    """Reports and heartbeats every second, running whatever version the bus holds."""
    while beats is None or beats.is_set():
        stored = await bus.current_config(POOL)
        version = stored.version if stored else 0
        await bus.publish_worker_stats(POOL, stats(name, version))
        await bus.heartbeat(POOL, name, {"config_version": version}, ttl_s=3.0)
        await asyncio.sleep(1.0)


@contextlib.asynccontextmanager
async def running(*coroutines):
    tasks = [asyncio.create_task(c) for c in coroutines]
    try:
        yield tasks
    finally:
        for task in tasks:
            await cancel_and_wait(task)


def test_a_controller_started_before_its_workers_is_ready_and_stays_ready_when_they_go():
    """Defect 1: with no worker alive, `max(seen, *reports, *alive)` was `max(int)`."""

    async def scenario():
        bus = LocalPoolBus()
        loop = control_loop(bus)
        beats = asyncio.Event()
        async with running(loop.run()):
            await asyncio.sleep(2.5)
            before_workers = (loop.state.ready, loop.state.ticks, dict(loop.state.errors))
            beats.set()
            async with running(worker(bus, "w1", beats), worker(bus, "w2", beats)):
                await asyncio.sleep(10)
                with_workers = (loop.state.workers_alive, loop.controller.config_changes)
                beats.clear()  # every heartbeat expires at once (a Redis frozen for 20 s)
                await asyncio.sleep(20)
            after = (loop.state.ready, loop.state.workers_alive, dict(loop.state.errors))
        return before_workers, with_workers, after

    before_workers, with_workers, after = run_virtual(scenario())
    assert before_workers == (True, 3, {})  # ticks at 0, 1 and 2 s
    assert with_workers[0] == 2 and with_workers[1] >= 1
    assert after == (True, 0, {})


def test_a_standby_leads_within_one_lease_of_the_leaders_death_and_versions_only_grow():
    async def scenario():
        bus = LocalPoolBus()
        first, second = control_loop(bus, "c1"), control_loop(bus, "c2")
        versions: list[int] = []

        async def watch():
            while True:
                stored = await bus.current_config(POOL)
                versions.append(stored.version if stored else 0)
                await asyncio.sleep(0.1)

        leader = asyncio.create_task(first.run())
        await asyncio.sleep(0.5)  # c1 starts first and takes the lease
        async with running(worker(bus, "w1"), worker(bus, "w2"), watch(), second.run()):
            await asyncio.sleep(20)
            second_task_started = first.state.leader and not second.state.leader
            published = first.state.published_version
            loop_time = asyncio.get_running_loop().time
            died_at = loop_time()
            await cancel_and_wait(leader)  # dies without a word: its lease runs out
            while not second.state.leader:
                await asyncio.sleep(0.05)
            took_over_s = loop_time() - died_at
            await asyncio.sleep(20)
        return second_task_started, published, took_over_s, second.state, versions

    standby_first, published, took_over_s, state, versions = run_virtual(scenario())
    assert standby_first and published > 1  # c1 led and moved the config
    assert took_over_s <= 3.0 + 1.0  # the lease, then the standby's next tick
    assert state.version >= published and versions == sorted(versions)


def test_a_controller_that_lost_its_lease_during_a_step_never_publishes():
    """Defect 5: the leader re-checks its lease right before a publish."""

    async def scenario():
        bus = LocalPoolBus()
        loop = control_loop(bus, lease_s=3.0)
        await loop.tick()  # leads, publishes v1
        await asyncio.sleep(3.5)  # a long step: the lease lapses, another controller leads
        assert await bus.acquire_or_renew_lease(POOL, "c2", 3.0)
        loop.controller.pin(Override(BatchConfig(64, 0.002), until_s=1e9))
        await loop.publish_if_changed()
        return await bus.current_config(POOL), loop.state.leader

    stored, leading = run_virtual(scenario())
    assert stored.version == 1 and stored.config != BatchConfig(64, 0.002)
    assert not leading


class Exploding:
    """A policy whose decisions fail for a while: a bug, as a tick sees it."""

    spec = "exploding"

    def __init__(self) -> None:
        self.failing = True

    def initial_config(self) -> BatchConfig:
        return BatchConfig(8, 0.001)

    def decide(self, snapshot):
        if self.failing:
            raise ZeroDivisionError("a bug in a policy")
        return build_policy("static:max_batch=8,timeout=1ms", PolicyContext(0.1, 1)).decide(
            snapshot
        )


def test_a_failing_step_is_counted_by_stage_shown_and_retried_until_it_recovers(caplog):
    async def scenario():
        bus = LocalPoolBus()
        policy = Exploding()
        loop = ControlLoop(Controller(policy, ControllerSettings(pool=POOL)), bus, "c1")
        async with running(worker(bus, "w1"), loop.run()):
            await asyncio.sleep(10)
            failing = (loop.state.ready, dict(loop.state.errors), loop.state.last_error)
            policy.failing = False
            await asyncio.sleep(15)  # the backoff is capped at 10 s
            return failing, (loop.state.ready, loop.state.last_error)

    failing, recovered = run_virtual(scenario())
    ready, errors, last_error = failing
    assert not ready and errors["step"] >= 3 and "a bug in a policy" in last_error
    assert recovered == (True, None)
    assert "tick failed at step" in caplog.text and "ZeroDivisionError" in caplog.text


def test_the_leader_publishes_desired_replicas_on_change_and_a_new_leader_restates_them():
    async def scenario():
        bus = LocalPoolBus()
        policy = build_policy("static:max_batch=8,timeout=1ms", PolicyContext(0.1, 2))
        settings = ControllerSettings(pool=POOL, workers=2, fleet=FleetLimits(1, 4))
        loop = ControlLoop(Controller(policy, settings), bus, "c1", 3.0)
        seen = []
        async with running(worker(bus, "w1"), worker(bus, "w2")):
            await loop.tick()
            seen.append(await bus.desired_replicas(POOL))
            loop.controller.pin(Override(BatchConfig(8, 0.001), until_s=1e9, replicas=3))
            await loop.publish_if_changed()
            seen.append(await bus.desired_replicas(POOL))
            await bus.publish_desired_replicas(POOL, 0)  # a bus that lost or garbled it
            await loop.tick()
            seen.append(await bus.desired_replicas(POOL))  # unchanged here: not rewritten
            await asyncio.sleep(3.5)  # the lease lapses and c2 leads for a while
            assert await bus.acquire_or_renew_lease(POOL, "c2", 3.0)
            await loop.tick()
            assert not loop.state.leader
            await asyncio.sleep(3.5)  # c2 is gone: c1 leads again and restates the count
            await loop.tick()
            seen.append(await bus.desired_replicas(POOL))
        return seen

    assert run_virtual(scenario()) == [2, 3, 0, 3]


def test_a_fixed_fleet_publishes_no_replica_count():
    async def scenario():
        bus = LocalPoolBus()
        loop = control_loop(bus)
        async with running(worker(bus, "w1")):
            await loop.tick()
        return await bus.desired_replicas(POOL)

    assert run_virtual(scenario()) is None


class Infeasible:
    """Predicts no config meets the SLO while `infeasible` is set."""

    spec = "infeasible"

    def __init__(self) -> None:
        self.infeasible = True

    def initial_config(self) -> BatchConfig:
        return BatchConfig(8, 0.002)

    def decide(self, snapshot):
        return Decision(snapshot.config, "best effort", meets_slo=not self.infeasible)


def test_a_pool_no_config_can_serve_is_said_once_and_its_end_once(caplog):
    async def scenario():
        bus = LocalPoolBus()
        policy = Infeasible()
        loop = ControlLoop(Controller(policy, ControllerSettings(pool=POOL)), bus, "c1", 3.0)
        async with running(worker(bus, "w1")):
            for _ in range(5):
                await loop.tick()
                await asyncio.sleep(1.0)
            policy.infeasible = False
            for _ in range(3):
                await loop.tick()
                await asyncio.sleep(1.0)

    with caplog.at_level(logging.INFO, "tidal.controller"):
        run_virtual(scenario())
    said = [r for r in caplog.records if "SLO" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.INFO]
    assert "no config is predicted to meet the SLO of 100 ms" in said[0].getMessage()
    assert "holding the best predicted (max_batch=8" in said[0].getMessage()
