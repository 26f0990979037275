"""Any engine on the pool's bus: a config the engine refuses is reported, not retried,
and the old config keeps serving; the controller sees which members refuse, which
engines serve the pool, and which members are alive but not ready.

In virtual time on the in-process bus, with an engine that serves nothing and refuses
caps above its limit (the rule a Ray Serve deployment's `max_ongoing_requests` sets);
the real engines' tests (test_ray_serve.py, test_triton.py) prove it on them.
"""

import asyncio
import logging

import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_control_loop_shell import control_loop
from test_controller_api import running
from virtual_time import run_virtual

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.change_cost import ChangeCost
from adaptive.config import BatchConfig
from server.bus.local import LocalPoolBus
from server.clock import LoopClock
from server.engines.member import EngineUnreachable, PoolMember
from server.engines.protocols import ConfigRejected
from server.engines.triton_cli import LEAVE_TIMEOUT_S, leave_pool
from server.tasks import BackgroundErrors


class CappedEngine:
    """Takes any config whose cap is at most `limit`; serves nothing."""

    kind = "capped"
    change_cost = ChangeCost(reload_s=1.0)

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.version = 0
        self.config: BatchConfig | None = None

    async def apply(self, published: VersionedConfig) -> None:
        if published.config.max_batch_size > self.limit:
            raise ConfigRejected(f"cap {published.config.max_batch_size} > {self.limit}")
        await asyncio.sleep(1.0)  # a reload: the old config serves meanwhile
        self.version, self.config = published.version, published.config

    async def collect(self) -> WorkerStats:
        return WorkerStats("m", 1.0, 0, 0, 0, (), 0.0, (), 0.0, 0, 1, None, self.version)

    def status(self) -> dict:
        return {"queue_depth": 0, "serving_max_batch": 1, "warmed_buckets": None}


def test_a_refused_config_is_reported_once_and_the_next_one_applies():
    async def scenario():
        bus, engine, errors = LocalPoolBus(), CappedEngine(16), BackgroundErrors()
        member = PoolMember(engine, bus, "pool", "m", LoopClock(), errors)
        member.start()
        seen = {}
        await bus.publish_config("pool", VersionedConfig(1, BatchConfig(8, 0.01)))
        await asyncio.sleep(1.5)
        seen["first"] = (engine.version, member.rejected)
        await bus.publish_config("pool", VersionedConfig(2, BatchConfig(64, 0.01)))
        await asyncio.sleep(1.5)
        seen["refused"] = (engine.version, engine.config, member.rejected)
        seen["heartbeat"] = (await bus.workers_alive("pool"))["m"]
        loop = control_loop(bus)
        loop._note_members(await bus.workers_alive("pool"))
        seen["controller"] = (
            dict(loop.state.refusing),
            dict(loop.state.engines),
            loop.state.unplanned_reloads,  # the engine reloads for 1 s; the plan says 0
        )
        await bus.publish_config("pool", VersionedConfig(3, BatchConfig(16, 0.01)))
        await asyncio.sleep(2.5)
        loop._note_members(await bus.workers_alive("pool"))
        seen["after"] = (engine.version, member.configs_applied, dict(loop.state.refusing))
        await member.stop()
        return seen, errors.counts

    seen, errors = run_virtual(scenario())
    assert seen["first"] == (1, None)
    refusal = {"version": 2, "config": "max_batch=64,timeout=10ms", "reason": "cap 64 > 16"}
    assert seen["refused"] == (1, BatchConfig(8, 0.01), refusal)
    heartbeat = seen["heartbeat"]
    assert heartbeat["engine"] == "capped" and heartbeat["rejected"] == refusal
    assert heartbeat["change_cost"] == {"warmup_per_bucket_s": 0.0, "reload_s": 1.0}
    assert seen["controller"] == ({"m": refusal}, {"capped": 1}, {"capped": 1.0})
    assert seen["after"] == (3, 2, {})  # a newer config applies; nobody refuses now
    assert errors == {}


def test_the_controller_shows_which_members_are_alive_but_not_ready(caplog):
    """Readiness on the wire: a member that says it is not ready is alive but not
    ready in the pool's summary, its workers view and /metrics; one that does not say
    (an older release, an engine without readiness) counts as ready; turning ready is
    logged once."""

    async def beat(bus, name, **info):
        await bus.heartbeat("p", name, {"config_version": 0, **info}, ttl_s=30.0)

    async def scenario():
        bus = LocalPoolBus()
        await beat(bus, "older")
        await beat(bus, "warm", ready=True, not_ready=None)
        await beat(bus, "warming", ready=False, not_ready="warming up (batch sizes warm so far: 1)")
        async with running(bus) as (control, api):
            ticks = control.loop.state.ticks
            while control.loop.state.ticks < ticks + 2:
                await asyncio.sleep(0.01)
            summary = (await api.get("/v1/pools/p")).json()
            workers = (await api.get("/v1/pools/p/workers")).json()["workers"]
            metrics = (await api.get("/metrics")).text
            await beat(bus, "warming", ready=True, not_ready=None)
            ticks = control.loop.state.ticks
            while control.loop.state.ticks < ticks + 2:
                await asyncio.sleep(0.01)
            after = (await api.get("/v1/pools/p")).json()
        return summary, workers, metrics, after

    with caplog.at_level(logging.INFO, logger="tidal.controller"):
        summary, workers, metrics, after = asyncio.run(scenario())
    warming = "warming up (batch sizes warm so far: 1)"
    assert (summary["workers_alive"], summary["workers_ready"]) == (3, 2)
    assert summary["workers_not_ready"] == {"warming": warming}
    assert {w["name"]: w["ready"] for w in workers} == {
        "older": True,
        "warm": True,
        "warming": False,
    }
    assert [w["not_ready"] for w in workers if w["name"] == "warming"] == [warming]
    gauges = {
        sample.name: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name.startswith("tidal_controller_workers_")
    }
    assert gauges == {"tidal_controller_workers_alive": 3, "tidal_controller_workers_ready": 2}
    assert (after["workers_ready"], after["workers_not_ready"]) == (3, {})
    said = [r.getMessage() for r in caplog.records if r.name == "tidal.controller"]
    assert said.count(f"p: warming not ready: {warming}") == 1
    assert said.count("p: warming ready") == 1


class FlakyEngine(CappedEngine):
    """A `CappedEngine` that does not answer while `away` (Triton down, a replica gone)."""

    def __init__(self) -> None:
        super().__init__(64)
        self.away = False

    async def apply(self, published: VersionedConfig) -> None:
        if self.away:
            raise EngineUnreachable("connection refused")
        await super().apply(published)

    async def collect(self) -> WorkerStats:
        if self.away:
            raise EngineUnreachable("connection refused")
        return await super().collect()


def test_an_unreachable_engine_is_an_outage_the_member_beats_through(caplog):
    """Logged once (no traceback a window), heartbeats on with the member not ready and
    why, a config published meanwhile applied once the engine answers again."""

    async def alive(bus) -> dict | None:
        return (await bus.workers_alive("pool")).get("m")

    async def scenario():
        bus, engine, errors = LocalPoolBus(), FlakyEngine(), BackgroundErrors()
        member = PoolMember(engine, bus, "pool", "m", LoopClock(), errors, heartbeat_ttl_s=3.0)
        member.start()
        await bus.publish_config("pool", VersionedConfig(1, BatchConfig(8, 0.01)))
        await asyncio.sleep(2.5)
        seen = {"before": await alive(bus)}
        engine.away = True
        await asyncio.sleep(2.0)
        await bus.publish_config("pool", VersionedConfig(2, BatchConfig(16, 0.01)))
        await asyncio.sleep(8.0)  # past the heartbeat's TTL twice over
        seen["away"] = await alive(bus)
        engine.away = False
        await asyncio.sleep(7.0)  # the config loop's backoff is 5 s at most
        seen["back"] = (await alive(bus), engine.version)
        await member.stop()
        return seen, errors.counts

    with caplog.at_level(logging.INFO, logger="tidal"):
        seen, errors = run_virtual(scenario())
    assert seen["before"]["config_version"] == 1 and "ready" not in seen["before"]
    away = seen["away"]
    assert away is not None, "the member left the pool while its engine was away"
    assert away["ready"] is False
    assert away["not_ready"] == "capped unreachable: connection refused"
    beat, version = seen["back"]
    assert "ready" not in beat and "not_ready" not in beat and version == 2
    assert errors == {}
    said = [r.getMessage() for r in caplog.records if r.name == "tidal.member"]
    assert sum("unreachable" in line for line in said) == 1, said
    assert sum("answers again" in line for line in said) == 1, said
    assert not [r for r in caplog.records if r.exc_info], "a traceback for an outage"


class StuckEngine(CappedEngine):
    """Its last window never comes (an adapter that hangs), or its collect has a bug."""

    def __init__(self, failure: str) -> None:
        super().__init__(64)
        self.failure = failure
        self.stopping = False

    async def collect(self) -> WorkerStats:
        if self.stopping and self.failure == "hangs":
            await asyncio.sleep(3600)
        if self.stopping and self.failure == "bug":
            raise KeyError("nv_inference_count")
        return await super().collect()


@pytest.mark.parametrize(("failure", "error"), [("hangs", "TimeoutError"), ("bug", "KeyError")])
def test_a_failure_while_leaving_the_pool_is_logged_with_its_traceback(caplog, failure, error):
    """`tidal engine triton` stopping: the member's stop either ends within its time or
    what went wrong is logged with its traceback, never swallowed; the process goes on
    to close the engine and exit."""

    async def scenario():
        engine = StuckEngine(failure)
        member = PoolMember(engine, LocalPoolBus(), "p", "m", LoopClock(), BackgroundErrors())
        member.start()
        await asyncio.sleep(2.5)
        engine.stopping = True
        started = asyncio.get_running_loop().time()
        await leave_pool(member)
        return asyncio.get_running_loop().time() - started

    with caplog.at_level(logging.INFO, logger="tidal"):
        took_s = run_virtual(scenario())
    assert took_s <= LEAVE_TIMEOUT_S
    failed = [r for r in caplog.records if "leaving the pool failed" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert failed[0].exc_info[0].__name__ == error
