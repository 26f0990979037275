"""The operator API on a running pool control (in-process bus, or a private Redis)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import replace

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from redis_server import redis_server

from adaptive.bus import WorkerStats
from adaptive.fleet import FleetLimits
from adaptive.latency import LatencyModel, parse_latency_model
from adaptive.overhead import RequestOverhead
from server.bus.local import LocalPoolBus
from server.bus.redis_bus import RedisBus, connect
from server.control.app import create_app
from server.control.metrics import ControllerMetrics
from server.control.plane import PoolControl, PoolPlan

TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
STATIC = "static:max_batch=8,timeout=5ms"


@contextlib.asynccontextmanager
async def running(
    bus,
    policy: str = STATIC,
    token: str | None = TOKEN,
    name: str = "c1",
    protect_reads: bool = False,
    fleet: FleetLimits | None = None,
    latency: LatencyModel | None = None,
):
    plan = PoolPlan(
        pool="p",
        policy=policy,
        latency=latency or parse_latency_model("linear:5,0.4"),
        tick_s=0.05,
        fleet=fleet,
    )
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    control = PoolControl(plan, bus, name, metrics.observe)
    await control.start()
    while not control.loop.state.leader:
        await asyncio.sleep(0.01)
    app = create_app({"p": control}, registry, metrics, token, protect_reads)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        try:
            yield control, client
        finally:
            await control.stop()


def test_writes_are_refused_without_a_configured_token_and_reads_stay_open():
    async def scenario():
        async with running(LocalPoolBus(), token=None) as (_, api):
            write = await api.delete("/v1/pools/p/override", headers=AUTH)
            read = await api.get("/v1/pools/p")
            missing = await api.get("/v1/pools/nope")
            metrics = await api.get("/metrics")
            return write, read, missing, metrics

    write, read, missing, metrics = asyncio.run(scenario())
    assert write.status_code == 403 and "none is configured" in write.json()["error"]
    assert read.status_code == 200 and read.json()["config"]["max_batch"] == 8
    assert missing.status_code == 404 and missing.json()["field"] == "pool"
    names = {f.name for f in text_string_to_metric_families(metrics.text)}
    assert {"tidal_controller_config_max_batch_size", "tidal_controller_leader"} <= names


def test_reads_can_be_made_to_need_the_token():
    async def scenario():
        async with running(LocalPoolBus(), protect_reads=True) as (_, api):
            return (
                await api.get("/v1/pools/p"),
                await api.get("/v1/pools/p", headers=AUTH),
                await api.get("/metrics"),
                await api.get("/healthz"),
            )

    anonymous, authorised, metrics, health = asyncio.run(scenario())
    assert anonymous.status_code == 401 and metrics.status_code == 401
    assert authorised.status_code == 200 and health.status_code == 200


def test_events_round_trip_and_bad_ones_name_the_field():
    start = time.time() + 3600
    sale = {"name": "sale", "start": start, "end": start + 600, "multiplier": 3}

    async def scenario():
        async with running(LocalPoolBus()) as (control, api):
            added = await api.post("/v1/pools/p/events", json={"events": [sale]}, headers=AUTH)
            again = await api.post("/v1/pools/p/events", json={"events": [sale]}, headers=AUTH)
            bad = await api.post(
                "/v1/pools/p/events",
                json={"events": [{**sale, "end": start - 1}]},
                headers=AUTH,
            )
            listed = await api.get("/v1/pools/p/events")
            unknown = await api.delete("/v1/pools/p/events?name=other", headers=AUTH)
            gone = await api.delete("/v1/pools/p/events?name=sale", headers=AUTH)
            return added, again, bad, listed, unknown, gone, control.events

    added, again, bad, listed, unknown, gone, left = asyncio.run(scenario())
    assert added.status_code == 200
    assert len(again.json()["events"]) == 1  # the same name replaces, never duplicates
    assert bad.status_code == 422 and bad.json()["field"] == "events"
    assert "event 1" in bad.json()["error"] and "end must be after start" in bad.json()["error"]
    assert listed.json()["events"][0]["multiplier"] == 3
    assert unknown.status_code == 404
    assert gone.json()["events"] == [] and left == ()


async def report_forever(bus) -> None:
    """A worker's stats every 50 ms: the controller decides on ticks that have news."""
    while True:
        stats = WorkerStats("w", 0.05, 5, 5, 0, (), 0.0, ((1, 5),), 0.01, 0, 8, (1, 2, 4, 8), 1)
        await bus.publish_worker_stats("p", stats)
        await asyncio.sleep(0.05)


def test_a_policy_switch_keeps_the_config_version_and_bad_specs_are_422():
    async def scenario():
        bus = LocalPoolBus()
        worker = asyncio.create_task(report_forever(bus))
        async with running(bus) as (control, api):
            pinned = await api.put(
                "/v1/pools/p/override",
                json={"max_batch": 4, "timeout_ms": 2, "duration": "1h"},
                headers=AUTH,
            )
            while control.controller.config.max_batch_size != 4:
                await asyncio.sleep(0.01)
            version = control.loop.state.version
            switched = await api.put(
                "/v1/pools/p/policy", json={"policy": "static:max_batch=16"}, headers=AUTH
            )
            bad = await api.put(
                "/v1/pools/p/policy", json={"policy": "static:max_batch=x"}, headers=AUTH
            )
            oracle = await api.put("/v1/pools/p/policy", json={"policy": "oracle"}, headers=AUTH)
            lifted = await api.delete("/v1/pools/p/override", headers=AUTH)
            while control.controller.config.max_batch_size != 16:
                await asyncio.sleep(0.01)
            worker.cancel()
            return pinned, version, switched, bad, oracle, lifted, control.loop.state.version

    pinned, version, switched, bad, oracle, lifted, final_version = asyncio.run(scenario())
    assert pinned.status_code == 200 and pinned.json()["override"]["max_batch"] == 4
    body = switched.json()
    assert body["policy"].startswith("static:max_batch=16") and body["version"] >= version
    assert body["mode"] == "override"  # the pin outlives the policy switch
    assert bad.status_code == 422 and bad.json()["field"] == "policy"
    assert "max_batch must be an integer" in bad.json()["error"]
    assert oracle.status_code == 422 and "simulation only" in oracle.json()["error"]
    assert lifted.json()["lifted"] is True and final_version > version


async def record_traffic(bus, seconds: int, rate_rps: int) -> None:
    """What a worker reporting every second for `seconds` leaves on the bus."""
    now = int(time.time())
    for second in range(now - seconds, now):
        stats = WorkerStats("w", 1.0, rate_rps, rate_rps, 0, (), 0.0, (), 0.0, 0, 8, (), 1)
        await bus.publish_worker_stats("p", stats, at_s=second)


def test_the_rollout_gate_compares_side_by_side_and_promotes_only_if_no_worse():
    async def scenario():
        bus = LocalPoolBus()
        async with running(bus) as (control, api):
            early = await api.post("/v1/pools/p/simulate", json={"candidate": "aimd"}, headers=AUTH)
            await record_traffic(bus, 240, 300)
            worse = await api.post(
                "/v1/pools/p/simulate",
                json={"candidate": "static:max_batch=1,timeout=0ms", "promote": True},
                headers=AUTH,
            )
            better = await api.post(
                "/v1/pools/p/simulate",
                json={"candidate": "static:max_batch=32,timeout=5ms", "promote": True},
                headers=AUTH,
            )
            return early, worse, better, control.policy_spec

    early, worse, better, policy = asyncio.run(scenario())
    assert early.status_code == 409 and "recorded traffic" in early.json()["error"]
    w = worse.json()
    # One worker at batch 1 serves ~185 req/s under linear:5,0.4: 300 req/s overruns it.
    assert w["traffic"]["seconds"] >= 240 and w["candidate"]["slo_attainment"] < 0.5
    assert w["current"]["slo_attainment"] > 0.99
    assert w["no_worse_on_slo"] is False and w["promoted"] is False
    b = better.json()
    assert b["no_worse_on_slo"] is True and b["promoted"] is True
    assert policy == "static:max_batch=32,timeout=5ms"


def test_with_the_time_outside_the_batcher_measured_the_gate_judges_what_clients_see():
    """40 ms outside the batcher: a 50 ms timeout holds the batcher's own SLO account at
    300 req/s, but clients would wait past 100 ms, so the gate refuses it."""
    outside = RequestOverhead((1.0,), (0.0, 1.0), ((0.040, 0.040),))
    latency = replace(parse_latency_model("linear:5,0.4"), overhead=outside)

    async def scenario():
        bus = LocalPoolBus()
        policy = "static:max_batch=32,timeout=5ms"
        async with running(bus, policy=policy, latency=latency) as (control, api):
            await record_traffic(bus, 240, 300)
            gate = await api.post(
                "/v1/pools/p/simulate",
                json={"candidate": "static:max_batch=32,timeout=50ms", "promote": True},
                headers=AUTH,
            )
            return gate.json(), control.policy_spec

    gate, policy = asyncio.run(scenario())
    current, candidate = gate["current"], gate["candidate"]
    assert gate["judged_on"] == "client_slo_attainment"
    assert candidate["slo_attainment"] > 0.99  # the batcher's own account holds
    assert candidate["client_slo_attainment"] < 0.95 and current["client_slo_attainment"] > 0.99
    assert candidate["client_latency_ms"]["p99"] > 100.0
    assert gate["no_worse_on_slo"] is False and gate["promoted"] is False
    assert policy == "static:max_batch=32,timeout=5ms"


def test_operator_settings_survive_a_controller_restart_on_redis():
    start = time.time() + 3600
    sale = {"name": "sale", "start": start, "end": start + 600, "multiplier": 2}

    async def scenario(url: str):
        bus = RedisBus(connect(url))
        async with running(bus) as (_, api):
            await api.put("/v1/pools/p/policy", json={"policy": "aimd"}, headers=AUTH)
            await api.post("/v1/pools/p/events", json={"events": [sale]}, headers=AUTH)
            await api.put(
                "/v1/pools/p/override",
                json={"max_batch": 4, "timeout_ms": 2, "duration": "1h", "reason": "canary"},
                headers=AUTH,
            )
        async with running(bus, policy="predictive", name="c2") as (control, api):
            return (await api.get("/v1/pools/p")).json(), control.events

    with redis_server() as url:
        pool, events = asyncio.run(scenario(url))
    assert pool["policy"] == "aimd"  # the stored spec wins over the command line's
    assert pool["override"]["reason"] == "canary" and pool["mode"] == "override"
    assert [e.name for e in events] == ["sale"]


def test_a_restarted_predictive_controller_forecasts_from_recorded_traffic():
    async def scenario():
        bus = LocalPoolBus()
        await record_traffic(bus, 1200, 40)
        async with running(bus, policy="predictive") as (control, api):
            forecast = (await api.get("/v1/pools/p/forecast")).json()
            return control.controller.feed.history.counts, forecast

    history, forecast = asyncio.run(scenario())
    # 10 s steps of 40 req/s; the last step may hold the seconds since the record ended.
    assert history.size >= 110 and set(history[-100:-1]) == {400.0}
    assert 30.0 <= forecast["forecast"]["points"][0]["mean_rps"] <= 40.0
    # 20 minutes are too little to fit on: the last-value stand-in, with its own band.
    assert forecast["forecast"]["fallback"].startswith("last value")
    assert forecast["forecast"]["band"] == "analytic"


def test_bad_stored_settings_are_loud_and_the_plan_keeps_control():
    """Defect 2: a bad events document on the bus left the pool "starting" forever."""

    async def scenario():
        bus = LocalPoolBus()
        bad_events = [{"name": "sale", "start": 100, "end": 50, "multiplier": 2}]
        await bus.save_setting("p", "events", bad_events)
        async with running(bus) as (control, api):
            while not control.loop.state.ready:
                await asyncio.sleep(0.01)
            return await api.get("/readyz"), await api.get("/v1/pools/p")

    ready, pool = asyncio.run(scenario())
    assert ready.status_code == 200
    health = ready.json()["pools"]["p"]
    assert "stored settings of pool 'p' ignored" in health["settings_error"]
    assert "end must be after start" in health["settings_error"]
    assert pool.json()["health"]["settings_error"] == health["settings_error"]
    assert pool.json()["policy"] == STATIC and pool.json()["events"] == []


def test_a_negative_seed_and_a_non_finite_event_are_422_with_json_bodies():
    """Defect 9: `"seed": -1` answered a plain-text 500; a NaN multiplier was stored and
    then failed every tick of every controller while the event was active."""

    async def scenario():
        async with running(LocalPoolBus()) as (_, api):
            seed = await api.post(
                "/v1/pools/p/simulate", json={"candidate": "aimd", "seed": -1}, headers=AUTH
            )
            nan = '{"events": [{"name": "x", "start": 0, "end": 60, "multiplier": NaN}]}'
            event = await api.post(
                "/v1/pools/p/events",
                content=nan,
                headers={**AUTH, "content-type": "application/json"},
            )
            return seed, event

    seed, event = asyncio.run(scenario())
    assert seed.status_code == 422 and seed.json()["field"] == "seed"
    assert event.status_code == 422 and event.json()["field"] == "events"
    assert "multiplier" in event.json()["error"]


def test_a_fleet_that_scales_says_how_many_replicas_it_wants():
    """--max-replicas live: the policy's count is in the pool's summary, its decisions
    and /metrics (tidal_controller_desired_replicas), for an autoscaler to act on."""
    busy = "serve-autoscaler:target_ongoing=1,upscale_delay=0s,look_back=1s"

    async def scenario():
        bus = LocalPoolBus()
        async with running(bus, policy=busy, fleet=FleetLimits(1, 6)) as (_control, api):
            before = (await api.get("/v1/pools/p")).json()["desired_replicas"]
            await bus.heartbeat("p", "w", {"replicas": 1}, 5.0)
            for _ in range(10):  # a queue of 4 on one replica: 4 ongoing for 1 each
                stats = WorkerStats("w", 0.05, 5, 5, 0, (), 0.0, ((1, 5),), 0.01, 4, 8, None, 1)
                await bus.publish_worker_stats("p", stats)
                await asyncio.sleep(0.05)
            summary = (await api.get("/v1/pools/p")).json()
            decisions = (await api.get("/v1/pools/p/decisions")).json()["decisions"]
            text = (await api.get("/metrics")).text
        return before, summary, decisions, text

    before, summary, decisions, text = asyncio.run(scenario())
    assert before == 1 and summary["desired_replicas"] >= 4
    out = next(d for d in decisions if d["kind"] == "scale_out")
    assert out["replicas_before"] == 1 and "ongoing requests" in out["reason"]
    families = {f.name: f for f in text_string_to_metric_families(text)}
    gauge = families["tidal_controller_desired_replicas"].samples[0]
    assert gauge.labels == {"pool": "p"} and gauge.value == summary["desired_replicas"]
    # A policy that does not predict never says the SLO cannot be met.
    assert summary["slo_feasible"] is True and summary["slo_infeasible_for_s"] is None
    assert families["tidal_controller_slo_infeasible"].samples[0].value == 0


def test_an_operator_pins_a_replica_count_like_a_config():
    pin = {"max_batch": 8, "timeout_ms": 5, "duration": "1h", "replicas": 3}

    async def scenario():
        async with running(LocalPoolBus(), fleet=FleetLimits(1, 6)) as (_control, api):
            pinned = await api.put("/v1/pools/p/override", json=pin, headers=AUTH)
            await asyncio.sleep(0.2)  # a few ticks: the policy has no say while pinned
            held = (await api.get("/v1/pools/p")).json()
        async with running(LocalPoolBus()) as (_control, api):
            fixed = await api.put("/v1/pools/p/override", json=pin, headers=AUTH)
        return pinned, held, fixed

    pinned, held, fixed = asyncio.run(scenario())
    assert pinned.status_code == 200 and pinned.json()["override"]["replicas"] == 3
    assert held["desired_replicas"] == 3 and held["mode"] == "override"
    assert fixed.status_code == 422 and fixed.json()["field"] == "replicas"
    assert "--max-replicas" in fixed.json()["error"]


async def report_slow_batches(bus) -> None:
    """A worker whose batches of 4 take 20 ms where the plan (linear:5,0.4) says 6.6 ms."""
    from adaptive.learned_latency import ExecutionTimes

    slow = (ExecutionTimes.from_samples(4, [0.020] * 10),)
    while True:
        stats = WorkerStats(
            "w", 0.05, 40, 40, 0, (), 0.0, ((4, 10),), 0.2, 0, 8, (1, 2, 4, 8), 1,
            execution=slow,
        )  # fmt: skip
        await bus.publish_worker_stats("p", stats)
        await asyncio.sleep(0.05)


def test_a_pool_learns_its_latency_from_serving_and_replans_on_it(tmp_path):
    from adaptive.latency import load_latency_table

    async def scenario():
        bus = LocalPoolBus()
        async with running(bus, policy="predictive") as (control, api):
            before = (await api.get("/v1/pools/p/latency-model")).json()
            worker = asyncio.create_task(report_slow_batches(bus))
            while control.loop.state.replans < 1:
                await asyncio.sleep(0.02)
            learned = (await api.get("/v1/pools/p/latency-model")).json()
            profile = (await api.get("/v1/pools/p/latency-model?format=profile")).json()
            bad = await api.get("/v1/pools/p/latency-model?format=csv")
            replanned = []
            while not replanned:  # the next tick's record says why (recorded as leader)
                await asyncio.sleep(0.02)
                decisions = (await api.get("/v1/pools/p/decisions?limit=1000")).json()
                replanned = [d for d in decisions["decisions"] if d.get("replanned")]
            scraped = (await api.get("/metrics")).text
            worker.cancel()
            return before, learned, profile, bad, replanned, scraped

    before, learned, profile, bad, replanned, scraped = asyncio.run(scenario())
    assert before["measured_batches"] == 0 and before["rebuilds"] == 0
    assert {s["source"] for s in before["sizes"]} == {"prior"}
    assert before["model"] == before["prior"] == "linear:5,0.4"
    four = next(s for s in learned["sizes"] if s["batch_size"] == 4)
    assert four["source"] in ("blended", "measured") and four["batches"] >= 30
    assert 6.6 < four["mean_ms"] < 20.0
    eight = next(s for s in learned["sizes"] if s["batch_size"] == 8)
    assert eight["source"].startswith("prior x")  # scaled by the slowdown batch 4 shows
    assert learned["rebuilds"] >= 1 and "batch 4" in learned["last_rebuild"]
    assert learned["planned_with"].startswith("learned from")
    path = tmp_path / "learned.json"
    path.write_text(json.dumps(profile))
    table = load_latency_table(path)  # what `simulate --latency-model` loads
    assert table.mean_s(np.array([4.0]))[0] * 1e3 == pytest.approx(four["mean_ms"], rel=0.05)
    assert bad.status_code == 422
    assert "rebuilt from serving" in replanned[0]["replanned"]
    families = {f.name: f for f in text_string_to_metric_families(scraped)}
    rebuilds = families["tidal_controller_latency_model_rebuilds"].samples
    assert rebuilds[0].value >= 1


def test_docs_work_offline_and_the_openapi_names_the_bearer_token():
    import re

    async def scenario():
        async with running(LocalPoolBus()) as (_, api):
            page = await api.get("/docs")
            assets = [
                await api.get(url) for url in re.findall(r"(?:src|href)=\"([^\"]+)\"", page.text)
            ]
            spec = (await api.get("/openapi.json")).json()
            redoc = await api.get("/redoc")
            return page, assets, spec, redoc

    page, assets, spec, redoc = asyncio.run(scenario())
    assert page.status_code == 200 and "swagger" in page.text.lower()
    # Every script, style and icon from this server: nothing from a CDN.
    urls = re.findall(r"https?://[^\"' )]+", page.text)
    assert urls and all(u.startswith("http://api/") for u in urls), urls
    assert assets and all(a.status_code == 200 and a.content for a in assets)
    assert redoc.status_code == 404  # ReDoc loads from a CDN: off
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    override = spec["paths"]["/v1/pools/{pool}/override"]["put"]
    assert override["security"] == [{"bearer": []}]
    assert "security" not in spec["paths"]["/v1/pools"]["get"]  # reads are open here


def test_an_override_with_coerced_types_is_422_naming_the_field():
    async def scenario():
        async with running(LocalPoolBus()) as (control, api):
            answers = [
                await api.put("/v1/pools/p/override", json=body, headers=AUTH)
                for body in (
                    {"max_batch": True, "timeout_ms": 5, "duration": "1m"},
                    {"max_batch": "8", "timeout_ms": 5, "duration": "1m"},
                )
            ]
            return answers, control.pinned

    answers, pinned = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [422, 422]
    assert all(a.json()["field"] == "max_batch" for a in answers)
    assert pinned is None  # nothing was pinned
