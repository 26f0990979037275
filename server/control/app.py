"""The operator API of the control plane (FastAPI; OpenAPI at /docs).

Reads show each pool's config in force, mode, leader, workers, forecast and the decision
log with its reasons. Writes steer it: a new policy, a pinned config that expires,
declared events, a rollout gate that simulates a candidate policy on the pool's recorded
traffic before promoting it. Writes need the bearer token (compared in constant time);
with no token configured they are refused, never open. Errors are JSON
`{"error": "...", "field": "..."}`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
from fastapi import Depends, FastAPI, Query
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from redis.exceptions import RedisError

from adaptive.config import BatchConfig
from adaptive.decisions import Mode, config_dict
from adaptive.histogram import NUM_BUCKETS, add_buckets, quantile_from_counts
from adaptive.latency import profile_document
from adaptive.learned_latency import PLANNED_SIZES
from forecaster.events import event_to_dict, events_from_document
from forecaster.series import epoch_seconds
from server.control.loop import member_ready
from server.control.metrics import ControllerMetrics
from server.control.plane import InsufficientHistory, PoolControl
from server.http_auth import TokenCheck
from server.http_docs import DOCS_APP_ARGS, serve_docs_offline
from server.http_edge import EdgeGuard, EdgeLimits
from server.http_errors import ApiError, body_refusals, error_responses, install_error_handlers
from tidal_base.errors import InvalidInput
from tidal_base.units import parse_duration_s


class PolicyRequest(BaseModel):
    policy: str = Field(description="a policy spec, e.g. predictive:forecaster=holt-winters")


class OverrideRequest(BaseModel):
    # Strict: pydantic's lax mode would take `true` as 1 and "8" as 8.
    model_config = ConfigDict(strict=True)

    max_batch: int = Field(ge=1, le=65536)
    timeout_ms: float = Field(ge=0, le=60_000, allow_inf_nan=False)
    warm_max_batch: int = Field(default=0, ge=0, le=65536)
    duration: str | float = Field(description='how long the pin holds: "15m", "2h" or seconds')
    reason: str = Field(default="", max_length=500)
    replicas: int | None = Field(
        default=None, ge=1, le=100_000, description="pin the replica count too (--max-replicas)"
    )


class EventsRequest(BaseModel):
    events: list[dict[str, Any]] = Field(
        description="events as in an events file: name, start, end, multiplier | rate_rps, "
        "ramp_up, ramp_down (times ISO-8601 or Unix seconds)"
    )


class SimulateRequest(BaseModel):
    candidate: str = Field(description="the candidate policy spec")
    hours: float = Field(default=1.0, gt=0, le=24 * 8, description="recorded traffic to replay")
    promote: bool = Field(default=False, description="switch to the candidate if no worse")
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="the replay's random seed")


class Health(BaseModel):
    status: Literal["ok"]


class PoolHealth(BaseModel):
    ready: bool
    status: str = Field(description="ticking, starting, failed to start: ..., tick failing: ...")
    errors: dict[str, int] = Field(description="failed ticks by stage")
    settings_error: str | None = Field(description="why stored settings were ignored")
    last_error: str | None = Field(default=None, description="absent until the loop runs")
    malformed_stats: int | None = Field(default=None, description="absent until the loop runs")


class Readiness(BaseModel):
    status: Literal["ready", "not ready"]
    error: str | None = Field(description="which pools are not ready, and why")
    pools: dict[str, PoolHealth]


class ThisController(BaseModel):
    name: str
    leading: bool


class PoolSummary(BaseModel):
    """A pool's state (documentation only: the handlers build the dict; the fields not
    named here are objects the decision log and docs/control-plane.md describe)."""

    model_config = ConfigDict(extra="allow")

    pool: str
    config: dict[str, float] = Field(description="max_batch, timeout_ms, warm_max_batch")
    version: int
    policy: str
    shadow: str | None
    slo_ms: float
    mode: str = Field(description="the policy's mode, or override while one is pinned")
    mode_reason: str | None
    override: dict[str, Any] | None
    events: list[str]
    leader: str | None = Field(description="the controller holding the pool's lease")
    this_controller: ThisController
    ready: bool
    workers_alive: int
    workers_ready: int = Field(description="alive and ready: warm, dispatching")
    workers_not_ready: dict[str, str] = Field(description="alive but not ready, and why")
    desired_replicas: int | None
    slo_feasible: bool
    slo_infeasible_for_s: float | None
    ticks: int
    last_tick_ms: float
    last_error: str | None
    health: PoolHealth
    config_changes: int
    fallback_s: float
    last_decision: dict[str, Any] | None


class PoolList(BaseModel):
    pools: list[PoolSummary] = Field(description="the pools whose control loop runs")


UNKNOWN_POOL = "no pool of that name (`field`: pool)"
POOL_DOWN = "the pool is starting or failed to start (`field`: pool)"
BUS_DOWN = POOL_DOWN + ", or the bus is unreachable"
NOT_LEADER = "this controller does not lead the pool: write to the leader"
POOL_READ = {404: UNKNOWN_POOL, 503: POOL_DOWN}
POOL_WRITE = {404: UNKNOWN_POOL, 409: NOT_LEADER, 503: BUS_DOWN}
WRITE = (401, 403)


def _responses(ok: type[BaseModel] | None, *statuses: int, when: dict[int, str]) -> dict:
    """A route's `responses=`: its 200's schema (documentation only, `response_model=None`
    keeps the handler's dict as it is) and the errors it answers."""
    answers: dict[int | str, Any] = {200: {"model": ok}} if ok is not None else {}
    return answers | error_responses(*statuses, when=when)


def create_app(
    pools: dict[str, PoolControl],
    registry: CollectorRegistry,
    metrics: ControllerMetrics,
    token: str | None = None,
    protect_reads: bool = False,
    lifespan=None,
    limits: EdgeLimits | None = None,
) -> FastAPI:
    app = FastAPI(
        title="Tidal control plane",
        description="Forecast-driven batching: inspect and steer each pool's decisions.",
        lifespan=lifespan,
        **DOCS_APP_ARGS,
    )
    serve_docs_offline(app)
    _serve_console(app)
    install_error_handlers(app)
    # Before FastAPI reads a body: bounded, and a write's token checked first.
    limits = limits or EdgeLimits()
    app.add_middleware(EdgeGuard, limits=limits, routes=lambda: app.routes)
    write = [Depends(TokenCheck(token))]
    read = write if protect_reads else []
    # What a read answers besides its own: the token only with --protect-reads.
    refused = (401, 403) if protect_reads else ()
    # Every body here is a small JSON document, under the one bound.
    body_write = POOL_WRITE | body_refusals(limits.body_bytes, limits.read_timeout_s)
    metrics.watch(lambda: pools.values())

    def pool_of(pool: str, write: bool = False) -> PoolControl:
        control = pools.get(pool)
        if control is None:
            raise ApiError(404, f"unknown pool {pool!r} (known: {', '.join(pools)})", "pool")
        if control.loop is None:
            why = f"failed to start: {control.start_error}" if control.start_error else "starting"
            raise ApiError(503, f"pool {pool!r} is {why}", "pool")
        if write and not control.loop.state.leader:
            # A standby's change would be overwritten when it next takes over.
            raise ApiError(409, f"this controller does not lead pool {pool!r}: write to the leader")
        return control

    @app.get("/healthz", tags=["health"], response_model=None, responses={200: {"model": Health}})
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["health"],
        responses={
            200: {"model": Readiness, "description": "every pool ticks"},
            503: {"model": Readiness, "description": "a pool is starting, or fails to tick"},
        },
    )
    async def readyz() -> Response:
        health = {name: _health(control) for name, control in pools.items()}
        waiting = [f"{name} ({h['status']})" for name, h in health.items() if not h["ready"]]
        body = {
            "status": "not ready" if waiting else "ready",
            "error": f"not ready: {', '.join(waiting)}" if waiting else None,
            "pools": health,
        }
        return JSONResponse(body, status_code=503 if waiting else 200)

    @app.get(
        "/v1/pools",
        tags=["pools"],
        dependencies=read,
        response_model=None,
        responses=_responses(PoolList, *refused, when={}),
    )
    async def list_pools() -> dict[str, Any]:
        return {"pools": [await _summary(c) for c in pools.values() if c.loop is not None]}

    @app.get(
        "/v1/pools/{pool}",
        tags=["pools"],
        dependencies=read,
        response_model=None,
        responses=_responses(PoolSummary, *refused, when=POOL_READ),
    )
    async def get_pool(pool: str) -> dict[str, Any]:
        return await _summary(pool_of(pool))

    @app.get(
        "/v1/pools/{pool}/decisions",
        tags=["pools"],
        dependencies=read,
        responses=_responses(
            None,
            *refused,
            when=POOL_READ
            | {
                422: "since is not Unix seconds or ISO-8601, or limit is not in 1..10000",
                503: BUS_DOWN,
            },
        ),
    )
    async def decisions(
        pool: str,
        since: str | None = Query(None, description="Unix seconds or ISO-8601"),
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        control = pool_of(pool)
        since_s = _moment(since, "since") if since is not None else None
        records = await _bus_call(control.bus.decisions(pool, count=10_000 if since else limit))
        if since_s is not None:
            records = [r for r in records if r.get("time", 0) >= since_s][:limit]
        return {"pool": pool, "decisions": records}

    @app.get(
        "/v1/pools/{pool}/forecast",
        tags=["pools"],
        dependencies=read,
        responses=_responses(None, *refused, when=POOL_READ),
    )
    async def forecast(pool: str) -> dict[str, Any]:
        return _forecast(pool_of(pool))

    @app.get(
        "/v1/pools/{pool}/timeline",
        tags=["pools"],
        dependencies=read,
        responses=_responses(
            None,
            *refused,
            when=POOL_READ | {422: "seconds is not in (0, 21600] or points not in 10..5000"},
        ),
    )
    async def timeline(
        pool: str,
        seconds: float = Query(3600, gt=0, le=6 * 3600, description="how far back"),
        points: int = Query(600, ge=10, le=5000, description="at most this many buckets"),
    ) -> dict[str, Any]:
        """Per tick (bucketed): arrival rate, worst p99, the cap asked, the smallest cap a
        worker serves, the warm cap, the timeout and the desired replicas."""
        control = pool_of(pool)
        return {"pool": pool, **control.loop.timeline.window(time.time(), seconds, points)}

    @app.get(
        "/v1/pools/{pool}/latency-model",
        tags=["pools"],
        dependencies=read,
        responses=_responses(
            None, *refused, when=POOL_READ | {422: "format is not summary or profile"}
        ),
    )
    async def latency_model(
        pool: str,
        format: Literal["summary", "profile"] = Query(
            "summary",
            description="summary: per size with its source; profile: the profile JSON "
            "that `simulate --latency-model` loads",
        ),
    ) -> dict[str, Any]:
        return _latency_model(pool_of(pool), format)

    @app.get(
        "/v1/pools/{pool}/workers",
        tags=["pools"],
        dependencies=read,
        responses=_responses(None, *refused, when=POOL_READ | {503: BUS_DOWN}),
    )
    async def workers(pool: str) -> dict[str, Any]:
        control = pool_of(pool)
        alive = await _bus_call(control.bus.workers_alive(pool))
        latest = control.loop.latest
        now = time.time()
        return {
            "pool": pool,
            "workers": [
                {
                    "name": name,
                    "heartbeat_age_s": round(now - info.get("time", now), 3),
                    **{k: v for k, v in info.items() if k != "time"},
                    "ready": member_ready(info),  # an older worker's beat does not say
                    "last_stats": _stats(latest.get(name)),
                }
                for name, info in sorted(alive.items())
            ],
        }

    @app.put(
        "/v1/pools/{pool}/policy",
        tags=["steer"],
        dependencies=write,
        response_model=None,
        responses=_responses(
            PoolSummary,
            *WRITE,
            when=body_write
            | {422: "a malformed body, or a policy spec that does not build (`field`: policy)"},
        ),
    )
    async def put_policy(pool: str, body: PolicyRequest) -> dict[str, Any]:
        control = pool_of(pool, write=True)
        await _bus_call(control.set_policy(body.policy))
        return await _summary(control)

    @app.put(
        "/v1/pools/{pool}/override",
        tags=["steer"],
        dependencies=write,
        responses=_responses(
            None,
            *WRITE,
            when=body_write
            | {
                422: "a malformed body, a config out of bounds, a duration that is not > 0, "
                "or replicas for a pool that does not scale (`field` names it)"
            },
        ),
    )
    async def put_override(pool: str, body: OverrideRequest) -> dict[str, Any]:
        control = pool_of(pool, write=True)
        try:
            config = BatchConfig(body.max_batch, body.timeout_ms / 1e3, body.warm_max_batch)
        except InvalidInput as error:
            raise ApiError(422, str(error), "max_batch") from None
        for_s = _duration(body.duration, "duration")
        pinned = await _bus_call(control.pin(config, for_s, body.reason, body.replicas), "replicas")
        return {"pool": pool, "override": pinned.to_dict()}

    @app.delete(
        "/v1/pools/{pool}/override",
        tags=["steer"],
        dependencies=write,
        responses=_responses(None, *WRITE, when=POOL_WRITE),
    )
    async def delete_override(pool: str) -> dict[str, Any]:
        lifted = await _bus_call(pool_of(pool, write=True).unpin())
        return {"pool": pool, "lifted": lifted}

    @app.get(
        "/v1/pools/{pool}/events",
        tags=["steer"],
        dependencies=read,
        responses=_responses(None, *refused, when=POOL_READ),
    )
    async def get_events(pool: str) -> dict[str, Any]:
        return {"pool": pool, "events": [event_to_dict(e) for e in pool_of(pool).events]}

    @app.post(
        "/v1/pools/{pool}/events",
        tags=["steer"],
        dependencies=write,
        responses=_responses(
            None,
            *WRITE,
            when=body_write
            | {422: "a malformed body, or an event that is not valid (`field`: events)"},
        ),
    )
    async def post_events(pool: str, body: EventsRequest) -> dict[str, Any]:
        control = pool_of(pool, write=True)
        try:
            added = events_from_document(body.events, "events")
        except InvalidInput as error:
            raise ApiError(422, str(error), "events") from None
        kept = tuple(e for e in control.events if e.name not in {a.name for a in added})
        await _bus_call(control.set_events(kept + added))
        return {"pool": pool, "events": [event_to_dict(e) for e in control.events]}

    @app.delete(
        "/v1/pools/{pool}/events",
        tags=["steer"],
        dependencies=write,
        responses=_responses(
            None,
            *WRITE,
            when=POOL_WRITE | {404: UNKNOWN_POOL + ", or no event of that name (`field`: name)"},
        ),
    )
    async def delete_events(
        pool: str, name: str | None = Query(None, description="only this event (default all)")
    ) -> dict[str, Any]:
        control = pool_of(pool, write=True)
        kept = () if name is None else tuple(e for e in control.events if e.name != name)
        if name is not None and len(kept) == len(control.events):
            raise ApiError(404, f"no event named {name!r} in pool {pool!r}", "name")
        await _bus_call(control.set_events(kept))
        return {"pool": pool, "events": [event_to_dict(e) for e in kept]}

    @app.post(
        "/v1/pools/{pool}/simulate",
        tags=["steer"],
        dependencies=write,
        responses=_responses(
            None,
            *WRITE,
            when=body_write
            | {
                409: NOT_LEADER + "; or the pool has recorded too little traffic for the gate "
                "(`field`: hours)",
                422: "a malformed body, or a candidate spec that does not build "
                "(`field`: candidate)",
            },
        ),
    )
    async def rollout_gate(pool: str, body: SimulateRequest) -> dict[str, Any]:
        control = pool_of(pool, write=True)
        try:
            gate = control.rollout_gate(body.candidate, body.hours, body.seed)
            result = await _bus_call(gate, field="candidate")
        except InsufficientHistory as error:
            raise ApiError(409, str(error), "hours") from None
        result["promoted"] = False
        if body.promote and result["no_worse_on_slo"]:
            # Built afresh from its spec: the replay's policy object holds state on the
            # replay's clock (an HPA's next sync at 3,601 s, windows that never expire).
            await _bus_call(control.set_policy(body.candidate))
            result["promoted"] = True
        return {"pool": pool, "current_policy": control.policy_spec, **result}

    @app.get(
        "/metrics",
        tags=["health"],
        dependencies=read,
        response_class=PlainTextResponse,
        responses={
            200: {"description": "Prometheus text exposition (version 0.0.4)"},
            **error_responses(*refused),
        },
    )
    async def prometheus() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


async def _bus_call(awaitable, field: str = "policy"):
    """Await a bus-backed operation: an unreachable bus is a 503, a bad spec a 422 that
    names `field` (the policy factories' own messages say what is wrong)."""
    try:
        return await awaitable
    except (RedisError, OSError) as error:
        raise ApiError(503, f"bus unreachable: {error}") from None
    except InsufficientHistory:
        raise
    except InvalidInput as error:
        raise ApiError(422, str(error), field) from None


def _duration(value: str | float, field: str) -> float:
    try:
        seconds = parse_duration_s(value, field=field)
    except InvalidInput as error:
        raise ApiError(422, str(error), field) from None
    if seconds <= 0:
        raise ApiError(422, f"{field} must be > 0", field)
    return seconds


def _moment(text: str, field: str) -> float:
    with contextlib.suppress(ValueError):
        return float(text)
    try:
        return epoch_seconds(datetime.fromisoformat(text))
    except ValueError:
        raise ApiError(422, f"{field}: not Unix seconds or ISO-8601: {text!r}", field) from None


def _health(control: PoolControl) -> dict[str, Any]:
    """A pool's readiness and what went wrong, for /readyz and the pool's status."""
    loop = control.loop
    if loop is None:
        status = f"failed to start: {control.start_error}" if control.start_error else "starting"
        return {"ready": False, "status": status, "errors": {}, "settings_error": None}
    state = loop.state
    if state.ready:
        status = "ticking"
    elif state.ticks == 0 and not state.errors:
        status = "starting"
    else:
        status = f"tick failing: {state.last_error}"
    return {
        "ready": state.ready,
        "status": status,
        "last_error": state.last_error,
        "errors": dict(state.errors),
        "malformed_stats": state.malformed_stats,
        "settings_error": control.settings_error,
    }


async def _summary(control: PoolControl) -> dict[str, Any]:
    controller, state = control.controller, control.loop.state
    leader = None
    with contextlib.suppress(RedisError, OSError):
        leader = await control.bus.leader(control.pool)
    pinned = control.active_override()
    return {
        "pool": control.pool,
        "config": config_dict(controller.config),
        "version": state.version,
        "policy": control.policy_spec,
        "shadow": controller.shadow.spec if controller.shadow is not None else None,
        "slo_ms": round(controller.settings.slo_s * 1e3, 3),
        "mode": "override" if pinned else controller.mode.value,
        "mode_reason": controller.mode_reason if controller.mode is Mode.FALLBACK else None,
        "override": pinned.to_dict() if pinned else None,
        "events": [e.name for e in control.events],
        "leader": leader,
        "this_controller": {"name": control.holder, "leading": state.leader},
        "ready": state.ready,
        "workers_alive": state.workers_alive,
        "workers_ready": state.workers_ready,
        "workers_not_ready": state.not_ready,
        # A fleet that scales (--max-replicas): how many replicas the pool should have.
        "desired_replicas": controller.replicas,
        # False while the policy predicts no config meets the SLO (it holds its best).
        "slo_feasible": controller.slo_infeasible_since is None,
        "slo_infeasible_for_s": None
        if controller.slo_infeasible_since is None
        else round(control.loop.clock.now() - controller.slo_infeasible_since, 1),
        "engines": dict(sorted(state.engines.items())),
        "refusing": state.refusing,
        "unplanned_reloads": state.unplanned_reloads,
        "ticks": state.ticks,
        "last_tick_ms": round(state.last_tick_s * 1e3, 3),
        "last_error": state.last_error,
        "health": _health(control),
        "config_changes": controller.config_changes,
        "fallback_s": controller.fallback_s,
        "last_decision": controller.last.to_dict() if controller.last else None,
    }


CONSOLE = Path(__file__).parent / "console"
"""The operator console's page, script, style and vendored uPlot (docs/console.md)."""


def _serve_console(app: FastAPI) -> None:
    """`/ui`: the console, every asset from this server (it works offline)."""
    app.mount("/ui/assets", StaticFiles(directory=CONSOLE), name="console")

    @app.get("/ui", tags=["console"], response_class=HTMLResponse)
    async def console() -> FileResponse:
        return FileResponse(CONSOLE / "index.html", headers={"cache-control": "no-cache"})

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui")


def _latency_model(control: PoolControl, form: str) -> dict[str, Any]:
    """The latency model learned from serving, per padded batch size, or as a profile."""
    controller = control.controller
    learner = controller.latency
    model = control.latency_model()
    if form == "profile":
        sizes = [e.batch_size for e in learner.estimates()] if learner else PLANNED_SIZES
        return profile_document(model, sizes)
    learning = controller.settings.learning
    drift = learner.drift(controller.planned_latency) if learner is not None else None
    return {
        "pool": control.pool,
        "prior": control.plan.latency.describe(),
        "model": model.describe(),
        "planned_with": controller.planned_latency.describe()
        if controller.planned_latency is not None
        else None,
        "measured_batches": round(learner.measured_batches, 1) if learner else 0,
        "drift": None
        if drift is None or drift.batch_size is None
        else {
            "relative": round(drift.relative, 4),
            "batch_size": drift.batch_size,
            "measure": drift.measure,
        },
        "rebuilds": controller.replans,
        "last_rebuild": controller.last_replan,
        "learning": {
            "half_life_s": learning.half_life_s,
            "prior_batches": learning.prior_batches,
            "min_batches": learning.min_batches,
            # None: learn and show only, never rebuild (--latency-drift 0).
            "drift_threshold": learning.drift_threshold
            if math.isfinite(learning.drift_threshold)
            else None,
            "min_interval_s": learning.min_interval_s,
        },
        "sizes": [e.to_dict() for e in learner.estimates()] if learner else [],
    }


def _forecast(control: PoolControl) -> dict[str, Any]:
    feed = control.controller.feed
    if feed is None:
        return {"pool": control.pool, "forecast": None, "note": "this policy does not forecast"}
    actual = feed.history
    recent = actual.counts[-60:]
    start = actual.start_s + actual.step_s * (actual.counts.size - recent.size)
    f = feed.forecast
    return {
        "pool": control.pool,
        "step_s": feed.step_s,
        "forecast": None
        if f is None
        else {
            "model": f.model,
            "fallback": f.fallback,
            "level": f.level,
            "band": f.band,
            "events": list(f.events),
            "points": [
                {
                    "time": round(float(t), 3),
                    "mean_rps": _round(m),
                    "lower_rps": _round(lo),
                    "upper_rps": _round(hi),
                }
                for t, m, lo, hi in zip(
                    _iter(f.times_s), f.mean_rps, f.lower_rps, f.upper_rps, strict=True
                )
            ],
        },
        "actual": [
            {"time": round(start + i * actual.step_s, 3), "rps": _round(c / actual.step_s)}
            for i, c in enumerate(recent)
        ],
        "steps_scored": feed.steps_scored,
        "steps_outside_band": feed.steps_outside,
    }


def _iter(values) -> Iterable[float]:
    return (float(v) for v in values)


def _round(value: float) -> float | None:
    return round(float(value), 3) if math.isfinite(value) else None


def _stats(stats) -> dict[str, Any] | None:
    if stats is None:
        return None
    return {
        "window_s": stats.window_s,
        "arrivals": stats.arrivals,
        "completed": stats.completed,
        "shed": stats.shed,
        "queue_depth": stats.queue_depth,
        "busy_s": round(stats.busy_s, 6),
        "batch_sizes": dict(stats.batch_sizes),
        "max_batch_size": stats.max_batch_size,
        # None: an engine without warm-up (Triton) has no warmed sizes to report.
        "warmed_buckets": None if stats.warmed_buckets is None else list(stats.warmed_buckets),
        "config_version": stats.config_version,
        # The worker's HTTP layer's queue, socket to batcher, over the window.
        "ingress_p50_ms": _sparse_quantile_ms(stats.ingress_buckets, 0.5),
        "ingress_p99_ms": _sparse_quantile_ms(stats.ingress_buckets, 0.99),
    }


def _sparse_quantile_ms(buckets: tuple[tuple[int, int], ...], q: float) -> float | None:
    if not buckets:
        return None
    value = quantile_from_counts(add_buckets(np.zeros(NUM_BUCKETS, dtype=np.int64), buckets), q)
    return None if value is None else round(value * 1e3, 3)
