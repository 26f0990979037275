"""The worker's HTTP API (FastAPI): inference, health, stats, config and metrics.

    POST /v1/infer   {"input": ..., "deadline_ms": 250}   (or header X-Deadline-Ms), or
                     the model's compact binary body (application/octet-stream:
                     float32 3x32x32 for demo-cnn, int32 token ids for demo-text)
                     -> {"output": ..., "timing": {ingress_ms, queue_wait_ms,
                                       batch_size, padded_size, execution_ms}}
    GET  /healthz (alive)    GET /readyz (serving and warm)    GET /v1/stats
    GET  /metrics (Prometheus text)
    PUT  /v1/config  {"max_batch": 32, "timeout_ms": 10, "warm_max_batch": 64}

`PUT /v1/config` is for a standalone worker and needs the bearer token (as the control
plane's writes do); a worker in a pool answers it 409, because the pool's controller
owns the config (a config set here would share a version number with the controller's
different one, and nothing would flag the diverged pool).

`ingress_ms` is the time from the request's arrival at the worker's socket to the
batcher: the HTTP layer's own queue (connection accept, the event loop reaching the
request, reading and decoding the body), which a busy machine can make the largest part
of what a client waits. A client that stamps `X-Sent-At` (Unix seconds, as `tidal
loadgen` does) is measured from that stamp, on the same host or clocks in sync; without
it, from when the worker's handler first ran.

Errors are JSON `{"error": "...", "field": "..."}`: 422 for a malformed body or an input
the model cannot take (naming the field), 429 with Retry-After when the queue is full,
504 when a request's deadline passes in the queue, 503 while draining or after the
dispatch loop died (`/healthz` is 503 then too), 401/403 for a missing or wrong token.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Literal

from fastapi import Depends, FastAPI, Header, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from adaptive.config import BatchConfig
from server.http_auth import TokenCheck
from server.http_docs import DOCS_APP_ARGS, serve_docs_offline
from server.http_edge import SMALL_BODY_BYTES, EdgeGuard, EdgeLimits
from server.http_errors import (
    body_refusals,
    error_response,
    error_responses,
    install_error_handlers,
)
from server.metrics_registry import process_registry
from server.worker.batching import DynamicBatcher
from server.worker.defaults import MAX_BODY_BYTES
from server.worker.frontends import FrontendPool
from server.worker.inference import Answer, InferRequest, answer, parse_request
from server.worker.link import WorkerLink
from server.worker.memory import describe_memory
from server.worker.metrics import WorkerMetrics
from server.worker.models import ServedModel
from server.worker.readiness import not_ready
from tidal_base.errors import InvalidInput


class ConfigRequest(BaseModel):
    # Strict: pydantic's lax mode would take `true` as 1 and "8" as 8.
    model_config = ConfigDict(strict=True)

    max_batch: int = Field(ge=1, le=65536)
    timeout_ms: float = Field(ge=0, le=60_000, allow_inf_nan=False)
    warm_max_batch: int = Field(default=0, ge=0, le=65536)


class Timing(BaseModel):
    ingress_ms: float = Field(description="socket to batcher: the HTTP layer's own queue")
    queue_wait_ms: float
    batch_size: int = Field(description="requests in the batch that served this one")
    padded_size: int = Field(description="the bucket the batch was padded to")
    execution_ms: float


class InferResponse(BaseModel):
    output: Any = Field(description="the model's output for this input")
    timing: Timing


class Health(BaseModel):
    status: Literal["ok"]
    model: str


class Ready(BaseModel):
    status: Literal["ready"]
    model: str
    warmed_buckets: list[int]


class ConfigInForce(BaseModel):
    max_batch: int
    timeout_ms: float
    warm_max_batch: int
    version: int = Field(description="bumped by each change (the controller's, in a pool)")


class WorkerStats(BaseModel):
    """What `GET /v1/stats` and `PUT /v1/config` answer (documentation only: the
    handlers build the dict, so a field added there is not dropped)."""

    config: ConfigInForce
    serving_max_batch: int = Field(description="the largest batch served now (warm sizes)")
    accepted_max_batch: int | None = Field(
        description="the largest batch accepted: memory_max_batch, lowered after an "
        "out-of-memory (null: no bound)"
    )
    warmed_buckets: list[int]
    warming: bool
    warmup_s: dict[str, float] = Field(description="seconds each bucket took to warm")
    queue_depth: int
    queue_bound: int | None = Field(
        description="the most requests that may wait now, past it 429 (null: unbounded)"
    )
    queue_bound_rule: str = Field(
        description="slo: what service_rate_rps clears within slo_ms, at least a full batch "
        "per instance; fixed: --max-queue; none: unbounded"
    )
    slo_ms: float | None = Field(description="--slo, when it bounds the queue")
    service_rate_rps: float | None = Field(
        description="requests per second the instances clear at the best batch size of "
        "their last 32 batches"
    )
    memory_max_batch: int | None = Field(
        description="the largest batch the model's memory allows, measured at start "
        "(--memory-budget on CPU); a config above it is refused here, clamped from a pool"
    )
    arrivals: int
    completed: int
    shed: int
    expired: int
    failed: int
    batches: int
    mean_batch_size: float | None
    busy_s: float
    oom_splits: int
    warmup_ooms: int
    ready: bool
    background_errors: dict[str, int]
    padding_waste: float | None


NOT_SERVING = "the dispatch loop died: this worker serves nothing until restarted"


def create_app(
    model: ServedModel,
    batcher: DynamicBatcher,
    link: WorkerLink | None = None,
    token: str | None = None,
    limits: EdgeLimits | None = None,
    frontends: FrontendPool | None = None,
) -> FastAPI:
    """The worker's app; the batcher (and its bus link, if any) start and stop with the
    app's lifespan. The link stops after the drain, so the last window is reported.
    `token` guards a standalone worker's `PUT /v1/config` (None: refused). With
    `frontends`, those processes take the HTTP traffic and hand inference requests to
    this process, whose own app they forward every other path to."""
    registry = process_registry("worker")
    metrics = WorkerMetrics(registry, batcher, model.name)
    codec = model.codec
    if frontends is not None:
        registry.register(frontends)

    async def serve_handed_off(parsed, ingress_s: float) -> Answer:
        return await answer(batcher, metrics, parsed, ingress_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        if link is not None:
            link.start()
        if frontends is not None:
            await frontends.start(serve_handed_off, batcher.errors)
        yield
        if link is not None:
            await link.leave()  # out of the pool at once; it drains what it holds
        if frontends is not None:
            await frontends.stop()  # they finish what they hold: answered from here
        await batcher.drain()
        if link is not None:
            await link.stop()

    app = FastAPI(title=f"Tidal worker: {model.name}", lifespan=lifespan, **DOCS_APP_ARGS)
    serve_docs_offline(app)

    install_error_handlers(app)
    # Only an input is large; every other body is a small JSON config.
    limits = limits or EdgeLimits(SMALL_BODY_BYTES, {"/v1/infer": MAX_BODY_BYTES})
    app.add_middleware(EdgeGuard, limits=limits, routes=lambda: app.routes)

    @app.post(
        "/v1/infer",
        responses={
            200: {"model": InferResponse, "description": "the model's output and timings"},
            **error_responses(
                when=body_refusals(limits.bound("/v1/infer"), limits.read_timeout_s)
                | {
                    400: "Content-Length is not a byte count",
                    415: "a binary body (application/octet-stream) to a model that takes JSON only",
                    422: "a malformed body, an input the model cannot take (`field`: input), "
                    "or an X-Deadline-Ms or X-Sent-At that is not a finite number (> 0)",
                    429: "the queue is full (--max-queue): retry after Retry-After seconds",
                    503: "draining (shutting down), or the dispatch loop died",
                    504: "the deadline (deadline_ms, else X-Deadline-Ms) passed in the queue",
                },
            ),
        },
        openapi_extra={
            "requestBody": {
                "content": {
                    "application/json": {"schema": InferRequest.model_json_schema()},
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                }
            }
        },
    )
    async def infer(
        request: Request,
        # Declared for the API's documentation and checked as numbers here; the values
        # are read again, with the body, by `parse_request` (as a front end reads them).
        x_deadline_ms: float | None = Header(default=None),
        x_sent_at: float | None = Header(
            default=None, description="Unix seconds the client sent at (for ingress_ms)"
        ),
    ) -> Any:
        handled_at, handled_wall = batcher.clock.now(), time.time()
        parsed = parse_request(
            codec,
            request.headers.get("content-type", ""),
            await request.body(),
            request.headers.get("x-deadline-ms"),
            request.headers.get("x-sent-at"),
            handled_wall,
        )
        if isinstance(parsed, Answer):
            return error_response(parsed.status, parsed.body["error"], parsed.body["field"])
        # Before the handler ran: the socket's and the event loop's queue (clamped: a
        # client clock ahead of ours is not negative time).
        before_s = max(0.0, handled_wall - parsed.origin_wall_s) if parsed.stamped else 0.0
        answered = await answer(
            batcher, metrics, parsed, before_s + batcher.clock.now() - handled_at
        )
        return JSONResponse(answered.body, answered.status, dict(answered.headers))

    @app.get(
        "/healthz",
        responses={
            200: {"model": Health, "description": "alive"},
            **error_responses(when={503: NOT_SERVING}),
        },
    )
    async def healthz() -> Any:
        if not batcher.ready:
            return error_response(503, f"not serving: the dispatch loop died ({batcher.failure!r})")
        return {"status": "ok", "model": model.name}

    @app.get(
        "/readyz",
        responses={
            200: {"model": Ready, "description": "serving, the starting sizes warm"},
            **error_responses(
                when={
                    503: "warming the starting config's batch sizes, front ends connecting, "
                    "or " + NOT_SERVING
                }
            ),
        },
    )
    async def readyz() -> Any:
        """Ready to take traffic: serving, the starting config's sizes warm (a load
        balancer that sent requests earlier would have them served at a partial cap) and
        every front end connected."""
        reason = not_ready(batcher, frontends)  # what the heartbeat says too
        if reason is not None:
            return error_response(503, f"not ready: {reason}")
        return {
            "status": "ready",
            "model": model.name,
            "warmed_buckets": list(batcher.warmed_buckets),
        }

    @app.get("/v1/stats", response_model=None, responses={200: {"model": WorkerStats}})
    async def stats() -> dict[str, Any]:
        if frontends is None:
            return _stats(batcher)
        return {**_stats(batcher), "frontends": frontends.summary()}

    refusals = body_refusals(limits.bound("/v1/config"), limits.read_timeout_s)
    if link is not None:
        _pooled_config_endpoint(app, link.pool, refusals)
    else:
        _standalone_config_endpoint(app, batcher, token, refusals)

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"description": "Prometheus text exposition (version 0.0.4)"}},
    )
    async def prometheus() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _pooled_config_endpoint(app: FastAPI, pool: str, refusals: dict[int, str]) -> None:
    @app.put(
        "/v1/config",
        status_code=409,
        responses=error_responses(
            when=refusals
            | {409: f"always: the controller of pool {pool!r} owns this worker's config"},
        ),
    )
    async def put_config() -> JSONResponse:
        return error_response(
            409,
            f"this worker serves pool {pool!r}, whose controller owns the config: pin one "
            f"through the controller's PUT /v1/pools/{pool}/override",
        )


def _standalone_config_endpoint(
    app: FastAPI, batcher: DynamicBatcher, token: str | None, refusals: dict[int, str]
) -> None:
    @app.put(
        "/v1/config",
        dependencies=[Depends(TokenCheck(token))],
        response_model=None,
        responses={
            200: {"model": WorkerStats, "description": "the new config in force, and stats"},
            **error_responses(
                401,
                403,
                when=refusals
                | {422: "a malformed body or a config out of bounds (`field` names it)"},
            ),
        },
    )
    async def put_config(body: ConfigRequest) -> Any:
        try:
            config = BatchConfig(body.max_batch, body.timeout_ms / 1e3, body.warm_max_batch)
        except InvalidInput as error:
            return error_response(422, str(error), "config")
        if (refused := _over_memory(body, batcher)) is not None:
            return refused
        batcher.reconfigure(config, batcher.version + 1)
        return _stats(batcher)


def _over_memory(body: ConfigRequest, batcher: DynamicBatcher) -> JSONResponse | None:
    """422 for a cap the model's memory cannot hold: warming it would allocate until it
    failed (a pool's controller is clamped instead: it cannot be answered)."""
    bound = batcher.memory_max_batch
    for field, value in (("max_batch", body.max_batch), ("warm_max_batch", body.warm_max_batch)):
        if bound is not None and value > bound:
            return error_response(
                422,
                f"{field} must be <= {bound}, the largest batch that fits in memory "
                f"({describe_memory(batcher.memory)}), got {value}",
                field,
            )
    return None


def _stats(batcher: DynamicBatcher) -> dict[str, Any]:
    s = batcher.stats
    return {
        "config": {
            "max_batch": batcher.config.max_batch_size,
            "timeout_ms": round(batcher.config.timeout_s * 1e3, 3),
            "warm_max_batch": batcher.config.warm_target,
            "version": batcher.version,
        },
        "serving_max_batch": batcher.serving_cap,
        "accepted_max_batch": batcher.accepted_cap,
        "warmed_buckets": list(batcher.warmed_buckets),
        "warming": batcher.warming,
        "warmup_s": {str(k): round(v, 6) for k, v in s.warmup_s.items()},
        "queue_depth": batcher.queue_depth,
        "arrivals": s.arrivals,
        "completed": s.completed,
        "shed": s.shed,
        "expired": s.expired,
        "failed": s.failed,
        "batches": s.batches,
        "mean_batch_size": s.batch_size_sum / s.batches if s.batches else None,
        "busy_s": round(s.busy_s, 6),
        "oom_splits": s.oom_splits,
        "warmup_ooms": s.warmup_ooms,
        "ready": batcher.ready,
        "background_errors": dict(batcher.errors.counts),
        "padding_waste": s.padding_waste_sum / s.batches if s.batches else None,
        **batcher.limits(),
    }
