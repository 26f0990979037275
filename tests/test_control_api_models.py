"""The operator API answers what its OpenAPI says, because its handlers return the
response models the OpenAPI is built from (server/control/schemas.py).

A pool with everything to show (a forecasting policy with a shadow, a fleet that scales,
a member reporting, a pin, both kinds of event, recorded traffic for the rollout gate)
answers every route with a body its documented schema accepts; a handler whose output
drifts from its model is a 500, never an undocumented body; the models forbid fields
they do not declare; and every route behind the token is refused at the edge before a
byte of its body is read.
"""

from __future__ import annotations

import asyncio
import time
import types
import typing

import httpx
import jsonschema
import pytest
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from test_controller_api import record_traffic

from adaptive.bus import WorkerStats
from adaptive.fleet import FleetLimits
from adaptive.latency import parse_latency_model
from adaptive.learned_latency import ExecutionTimes
from server.bus.local import LocalPoolBus
from server.control import routes_pools, schemas
from server.control.app import create_app
from server.control.metrics import ControllerMetrics
from server.control.plane import PoolControl, PoolPlan

TOKEN = "s3cret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
PASS_THROUGH = {schemas.WorkerRow, schemas.PolicyOutcome}
"""Models of documents produced elsewhere (a heartbeat, simulate's summary): they allow
fields beyond those they declare. Every other response model forbids them."""


def pool(bus, name: str = "p", shadow: str | None = "aimd") -> PoolControl:
    plan = PoolPlan(
        name,
        "predictive",
        parse_latency_model("linear:5,0.4"),
        tick_s=0.05,
        fleet=FleetLimits(1, 6),
        shadow=shadow,
    )
    return PoolControl(plan, bus, "c1", ControllerMetrics(CollectorRegistry()).observe)


def app_of(pools: dict[str, PoolControl], protect_reads: bool = False):
    registry = CollectorRegistry()
    return create_app(pools, registry, ControllerMetrics(registry), TOKEN, protect_reads)


async def serve_a_member(bus) -> None:
    """A member's heartbeat (with fields of its own) and a few windows of stats."""
    info = {"replicas": 1, "ready": True, "engine": "tidal-worker", "config_version": 1}
    await bus.heartbeat("p", "w", {**info, "time": time.time()}, 60.0)
    measured = (ExecutionTimes.from_samples(4, [0.02] * 10),)
    for _ in range(6):
        stats = WorkerStats(
            "w", 0.05, 40, 40, 0, (), 0.0, ((4, 10),), 0.2, 0, 8, (1, 2, 4, 8), 1,
            execution=measured, ingress_buckets=((100, 3),),
        )  # fmt: skip
        await bus.publish_worker_stats("p", stats)
        await asyncio.sleep(0.05)


SOON = time.time() + 3600
EVENTS = [
    {"name": "sale", "start": SOON, "end": SOON + 600, "multiplier": 3},
    {"name": "launch", "start": SOON, "end": SOON + 600, "rate_rps": 50},
]
CALLS = [
    ("PUT", "/v1/pools/p/override", {"max_batch": 4, "timeout_ms": 2, "duration": "1h", "replicas": 2}),  # noqa: E501
    ("POST", "/v1/pools/p/events", {"events": EVENTS}),
    ("GET", "/healthz", None),
    ("GET", "/v1/pools", None),
    ("GET", "/v1/pools/p", None),
    ("GET", "/v1/pools/p/decisions?limit=5", None),
    ("GET", "/v1/pools/p/forecast", None),
    ("GET", "/v1/pools/p/timeline", None),
    ("GET", "/v1/pools/p/latency-model", None),
    ("GET", "/v1/pools/p/latency-model?format=profile", None),
    ("GET", "/v1/pools/p/workers", None),
    ("GET", "/v1/pools/p/events", None),
    ("POST", "/v1/pools/p/simulate", {"candidate": "static:max_batch=32", "hours": 0.1}),
    ("PUT", "/v1/pools/p/policy", {"policy": "aimd"}),
    ("GET", "/v1/pools/p/forecast", None),  # a policy that does not forecast
    ("DELETE", "/v1/pools/p/events?name=sale", None),
    ("DELETE", "/v1/pools/p/override", None),
]  # fmt: skip


def test_every_route_answers_a_body_its_documented_schema_accepts():
    async def scenario():
        bus = LocalPoolBus()
        await record_traffic(bus, 240, 40)
        pools = {"p": pool(bus), "idle": pool(bus, "idle")}  # "idle" never starts
        app = app_of(pools)
        await pools["p"].start()
        while not pools["p"].loop.state.leader:
            await asyncio.sleep(0.01)
        await serve_a_member(bus)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
            answers = [
                (method, path, await api.request(method, path, json=body, headers=AUTH))
                for method, path, body in CALLS
            ]
            answers.append(("GET", "/readyz", await api.get("/readyz")))
        await pools["p"].stop()
        return app.openapi(), answers

    spec, answers = asyncio.run(scenario())
    for method, path, answer in answers:
        status = 503 if path == "/readyz" else 200  # "idle" is starting
        assert answer.status_code == status, (method, path, answer.text)
        route = "/v1/pools/{pool}" + path.split("?")[0].removeprefix("/v1/pools/p")
        operation = spec["paths"].get(route) or spec["paths"][path.split("?")[0]]
        documented = operation[method.lower()]["responses"][str(status)]
        schema = documented["content"]["application/json"]["schema"]
        # The OpenAPI's references (#/components/...) resolve against this document.
        jsonschema.validate(answer.json(), schema | {"components": spec["components"]})
    bodies = {(m, p): a.json() for m, p, a in answers}
    workers = bodies["GET", "/v1/pools/p/workers"]["workers"]
    assert workers[0]["engine"] == "tidal-worker"  # the heartbeat's own fields ride along
    assert bodies["GET", "/v1/pools/p/latency-model?format=profile"]["points"]
    forecasting, after_switch = (a.json() for m, p, a in answers if p == "/v1/pools/p/forecast")
    assert "note" not in forecasting and forecasting["forecast"]["points"]
    assert set(after_switch) == {"pool", "forecast", "note"}  # absent, not null
    events = bodies["GET", "/v1/pools/p/events"]["events"]
    assert {"multiplier", "rate_rps"} & set(events[0]) == {"multiplier"}
    assert {"multiplier", "rate_rps"} & set(events[1]) == {"rate_rps"}
    starting = bodies["GET", "/readyz"]["pools"]["idle"]
    assert set(starting) == {"ready", "status", "errors", "settings_error"}


def test_a_handler_whose_output_drifts_from_its_model_is_a_500(monkeypatch):
    """What the schemathesis run (tests/test_api_schema.py) counts as a failure."""

    async def with_an_undeclared_field(control):
        return {**(await real(control)).model_dump(), "forecast_failures": 3}

    async def without_a_declared_one(control):
        body = (await real(control)).model_dump()
        del body["ticks"]
        return body

    async def scenario(summary):
        monkeypatch.setattr(routes_pools, "pool_summary", summary)
        control = pool(LocalPoolBus(), shadow=None)
        await control.start()
        transport = httpx.ASGITransport(app=app_of({"p": control}), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as api:
            answer = await api.get("/v1/pools/p")
        await control.stop()
        return answer

    real = routes_pools.pool_summary
    for drifted in (with_an_undeclared_field, without_a_declared_one):
        answer = asyncio.run(scenario(drifted))
        assert answer.status_code == 500, drifted.__name__
        assert answer.json() == {"error": "internal error: ResponseValidationError", "field": None}


def models_in(annotation) -> set[type[BaseModel]]:
    """The models an annotation names, through unions, lists and dicts."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        found = {annotation}
        for field in annotation.model_fields.values():
            found |= models_in(field.annotation)
        return found
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is not None:
        return set().union(*(models_in(a) for a in typing.get_args(annotation)))
    return set()


def test_every_json_route_returns_a_model_that_forbids_undeclared_fields():
    app = app_of({})
    checked = set()
    for route in app.routes:
        tags = getattr(route, "tags", [])
        if not {"health", "pools", "steer"} & set(tags) or route.path in ("/readyz", "/metrics"):
            continue  # /readyz serializes its Readiness itself; /metrics is text
        models = models_in(route.response_model)
        assert models, f"{route.path} {route.methods} declares no response model"
        checked |= models
    checked |= models_in(schemas.Readiness)
    for model in checked:
        extra = "allow" if model in PASS_THROUGH else "forbid"
        assert model.model_config.get("extra") == extra, model.__name__
    assert issubclass(schemas.PoolSummary, schemas.ResponseModel)


@pytest.mark.parametrize("protect_reads", [False, True])
def test_the_edge_refuses_a_request_without_the_token_before_reading_its_body(protect_reads):
    """Every route the OpenAPI puts behind the token: found by the edge (server.http_edge)
    among the app's routes, and answered 401 without its body ever being asked for."""
    app = app_of({"p": pool(LocalPoolBus())}, protect_reads)
    protected = [
        (method.upper(), path.replace("{pool}", "p"))
        for path, operations in app.openapi()["paths"].items()
        for method, operation in operations.items()
        if operation.get("security")
    ]
    reads = [(m, p) for m, p in protected if m == "GET"]
    assert len(protected) == 7 + (9 if protect_reads else 0) and bool(reads) == protect_reads

    async def body_never_read():
        raise AssertionError("the body was read before the token was checked")

    async def call(method: str, path: str) -> int:
        sent = []

        async def send(message):
            sent.append(message)

        scope = {
            "type": "http", "method": method, "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
            "server": ("api", 80), "client": ("c", 1),
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"9")],
        }  # fmt: skip
        await app(scope, body_never_read, send)
        return sent[0]["status"]

    for method, path in protected:
        assert asyncio.run(call(method, path)) == 401, (method, path)
