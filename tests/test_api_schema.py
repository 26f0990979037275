"""Both APIs against their own OpenAPI, in process over ASGI (schemathesis): no 5xx, and
every response's status, content type, headers and body as documented. Then exact tests
of the one error shape where Starlette, not a handler, answers: an unknown path (404), a
wrong method (405, with Allow) and a body that is not JSON.

The worker serves an echo model (a finite number in, twice it out) on a batcher whose
batches and warm-ups take no time, so a case the model takes is a 200 at once. The
controller runs one pool on the in-process bus (a static policy, leading from its first
tick) beside one never started (503). Most cases carry the token, some none or a wrong
one; half name a real pool. Hypothesis is derandomized, so every run sends the same cases.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import struct

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from schemathesis.checks import not_a_server_error
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from test_worker_batcher import cold, virtual

from adaptive.config import BatchConfig
from adaptive.latency import parse_latency_model
from server.bus.local import LocalPoolBus
from server.control.app import create_app as create_controller_app
from server.control.metrics import ControllerMetrics
from server.control.plane import PoolControl, PoolPlan
from server.worker.app import create_app as create_worker_app
from server.worker.link import WorkerLink
from server.worker.models import ServedModel
from tidal_base.errors import InvalidInput

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CREDENTIALS = [AUTH, AUTH, AUTH, {}, {"Authorization": "Bearer wrong"}]
# 503 and 504 are answers, not crashes: a pool not started, a worker warming or draining,
# a deadline passed. status_code_conformance checks that the operation documents them.
CONFIG = schemathesis.Config.from_dict(
    {"checks": {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "503", "504"]}}}
)
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# A bounded, repeatable run (about 15 s on 2 cores): no deadline (a cold first call
# imports and warms), derandomized, a few cases per operation.
BOUNDED = settings(
    max_examples=25,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"expected a finite number, got {value!r:.40}")
    return float(value)


def _from_bytes(body: bytes) -> float:
    if len(body) != 4:
        raise InvalidInput(f"expected one float32 (4 bytes), got {len(body)} bytes")
    return _number(struct.unpack("<f", body)[0])


ECHO = ServedModel(
    name="echo",
    module=None,  # the echo runner below never calls it
    collate=lambda inputs, padded: (inputs,),
    validate=_number,
    example=float,
    from_bytes=_from_bytes,
)


def worker_app(pooled: bool = False):
    batcher = virtual(cold(), BatchConfig(4, 0.001), service_s=0.0, warm_s=0.0)
    link = WorkerLink(batcher, LocalPoolBus(), "search", "w0") if pooled else None
    return create_worker_app(ECHO, batcher, link, token=TOKEN)


def controller_app(token: str | None = TOKEN):
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    bus = LocalPoolBus()

    def control(pool: str) -> PoolControl:
        latency = parse_latency_model("linear:5,0.4")
        plan = PoolPlan(pool, "static:max_batch=8,timeout=5ms", latency, tick_s=0.05)
        return PoolControl(plan, bus, "c1", metrics.observe)

    pools = {"p": control("p"), "idle": control("idle")}

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await pools["p"].start()  # "idle" never starts: its routes answer 503
        for _ in range(500):
            if pools["p"].loop.state.leader:
                break
            await asyncio.sleep(0.01)
        yield
        await pools["p"].stop()

    return create_controller_app(pools, registry, metrics, token, lifespan=lifespan)


@pytest.fixture(scope="module", autouse=True)
def _stop_apps():
    """schemathesis runs each app's lifespan once, on its own event loop thread, until
    told to stop: stop them (the pool's control loop ticks) when this module is done."""
    yield
    shutdown_lifespans()


@pytest.fixture(scope="module")
def worker_schema():
    return schemathesis.openapi.from_asgi("/openapi.json", worker_app(), config=CONFIG)


@pytest.fixture(scope="module")
def pooled_worker_schema():
    return schemathesis.openapi.from_asgi("/openapi.json", worker_app(pooled=True), config=CONFIG)


@pytest.fixture(scope="module")
def controller_schema():
    return schemathesis.openapi.from_asgi("/openapi.json", controller_app(), config=CONFIG)


worker = schemathesis.pytest.from_fixture("worker_schema")
pooled_worker = schemathesis.pytest.from_fixture("pooled_worker_schema")
controller = schemathesis.pytest.from_fixture("controller_schema")


def call_and_validate(case, data) -> None:
    if "pool" in (case.path_parameters or {}):
        case.path_parameters["pool"] = data.draw(st.sampled_from(["p", "idle", "p", "nope"]))
    case.call_and_validate(headers=data.draw(st.sampled_from(CREDENTIALS)), checks=CHECKS)


# PUT /v1/config is tested after the rest: a generated config may hold every later
# inference for its timeout (up to 60 s) waiting for a batch to fill.
@worker.exclude(method="PUT", path="/v1/config").parametrize()
@worker.given(data=st.data())
@BOUNDED
def test_the_worker_answers_as_documented(case, data):
    call_and_validate(case, data)


@worker.include(method="PUT", path="/v1/config").parametrize()
@worker.given(data=st.data())
@BOUNDED
def test_the_worker_config_answers_as_documented(case, data):
    call_and_validate(case, data)


@pooled_worker.include(method="PUT", path="/v1/config").parametrize()
@pooled_worker.given(data=st.data())
@BOUNDED
def test_a_pooled_worker_config_answers_as_documented(case, data):
    call_and_validate(case, data)


@controller.parametrize()
@controller.given(data=st.data())
@BOUNDED
def test_the_controller_answers_as_documented(case, data):
    call_and_validate(case, data)


@pytest.mark.parametrize("make", [worker_app, controller_app], ids=["worker", "controller"])
def test_every_error_is_documented_as_the_one_shape(make):
    """FastAPI's own 422 (HTTPValidationError, a shape never sent) is gone, and every
    4xx and 5xx a route documents is an ErrorBody (the controller's /readyz excepted: its
    503 is the readiness report)."""
    schema = make().openapi()
    assert not {"HTTPValidationError", "ValidationError"} & set(schema["components"]["schemas"])
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if int(status) < 400 or (path == "/readyz" and "Readiness" in str(response)):
                    continue
                body = response["content"]["application/json"]["schema"]
                assert body == {"$ref": "#/components/schemas/ErrorBody"}, (method, path)


def answer(app, method: str, path: str, **kwargs) -> httpx.Response:
    async def send():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            return await client.request(method, path, **kwargs)

    return asyncio.run(send())


@pytest.mark.parametrize("make", [worker_app, controller_app], ids=["worker", "controller"])
def test_an_unknown_path_is_404_in_the_one_shape(make):
    r = answer(make(), "GET", "/v2/nothing")
    assert r.status_code == 404
    assert r.json() == {"error": "no such path: /v2/nothing", "field": None}


def test_a_wrong_method_is_405_with_allow():
    r = answer(worker_app(), "DELETE", "/v1/config", headers=AUTH)
    assert r.status_code == 405 and r.headers["allow"] == "PUT"
    assert r.json() == {
        "error": "DELETE is not allowed on /v1/config (allowed: PUT)",
        "field": None,
    }
    r = answer(controller_app(), "POST", "/v1/pools/p/override", headers=AUTH)
    assert r.status_code == 405 and r.headers["allow"] == "PUT, DELETE"
    assert r.json()["error"].startswith("POST is not allowed on /v1/pools/p/override")


def test_a_body_that_is_not_json_says_where_not_a_field():
    body = '{"policy": "static:max_batch=8",, }'
    json = {**AUTH, "content-type": "application/json"}
    r = answer(controller_app(), "PUT", "/v1/pools/p/policy", content=body, headers=json)
    assert r.status_code == 422
    assert r.json() == {
        "error": "body: invalid JSON at character 32: Expecting property name enclosed in "
        "double quotes",
        "field": None,
    }
    r = answer(worker_app(), "POST", "/v1/infer", content='{"input": 1', headers=AUTH)
    assert r.status_code == 422
    assert r.json() == {
        "error": "body: invalid JSON: EOF while parsing an object at line 1 column 11",
        "field": None,
    }


def test_a_json_body_that_is_not_utf8_is_400_in_the_one_shape():
    r = answer(
        controller_app(),
        "PUT",
        "/v1/pools/p/policy",
        content=b'{"policy": "\xff"}',
        headers={**AUTH, "content-type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json() == {
        "error": "body: not UTF-8 ('utf-8' codec can't decode byte 0xff in position 12: "
        "invalid start byte)",
        "field": None,
    }


def test_a_bad_parameter_or_header_is_named_as_the_client_spells_it():
    """As the handlers' own refusals name them (`since`, `x-deadline-ms`), never with
    FastAPI's location in front (`query.limit`, `header.x-deadline-ms`)."""
    r = answer(controller_app(), "GET", "/v1/pools/p/decisions?limit=0")
    assert r.status_code == 422
    assert r.json() == {
        "error": "limit: Input should be greater than or equal to 1",
        "field": "limit",
    }
    r = answer(worker_app(), "POST", "/v1/infer", json={"input": 1}, headers={"x-sent-at": "x"})
    assert r.status_code == 422 and r.json()["field"] == "x-sent-at"
