"""Reading the pools (tag `pools`): status, decision log, forecast, timeline, latency
model, members.

All are reads: behind the token only with --protect-reads (`route_table.Access.READ`).
"""

from __future__ import annotations

import contextlib
import time
from datetime import datetime
from typing import Literal

from fastapi import Query

from forecaster.series import epoch_seconds
from server.control.api_state import BUS_DOWN, POOL_READ, Api, bus_call
from server.control.pool_views import (
    latency_profile,
    latency_summary,
    pool_forecast,
    pool_summary,
    worker_rows,
)
from server.control.route_table import Access, RouteTable
from server.control.schemas import (
    DecisionLog,
    LatencyModelSummary,
    LatencyProfile,
    PoolForecast,
    PoolList,
    PoolSummary,
    PoolTimeline,
    WorkerList,
)
from server.http_errors import ApiError, error_responses

routes = RouteTable("pools")


@routes.get("/v1/pools", access=Access.READ)
async def list_pools(api: Api) -> PoolList:
    running = [c for c in api.pools.values() if c.loop is not None]
    return PoolList(pools=[await pool_summary(c) for c in running])


@routes.get("/v1/pools/{pool}", access=Access.READ, responses=error_responses(when=POOL_READ))
async def get_pool(pool: str, api: Api) -> PoolSummary:
    return await pool_summary(api.running(pool))


@routes.get(
    "/v1/pools/{pool}/decisions",
    access=Access.READ,
    responses=error_responses(
        when=POOL_READ
        | {
            422: "since is not Unix seconds or ISO-8601, or limit is not in 1..10000",
            503: BUS_DOWN,
        },
    ),
)
async def decisions(
    pool: str,
    api: Api,
    since: str | None = Query(None, description="Unix seconds or ISO-8601"),
    limit: int = Query(100, ge=1, le=10_000),
) -> DecisionLog:
    control = api.running(pool)
    since_s = _moment(since, "since") if since is not None else None
    records = await bus_call(control.bus.decisions(pool, count=10_000 if since else limit))
    if since_s is not None:
        records = [r for r in records if r.get("time", 0) >= since_s][:limit]
    return DecisionLog(pool=pool, decisions=records)


@routes.get(
    "/v1/pools/{pool}/forecast",
    access=Access.READ,
    responses=error_responses(when=POOL_READ),
    response_model_exclude_unset=True,
)
async def forecast(pool: str, api: Api) -> PoolForecast:
    return pool_forecast(api.running(pool))


@routes.get(
    "/v1/pools/{pool}/timeline",
    access=Access.READ,
    responses=error_responses(
        when=POOL_READ | {422: "seconds is not in (0, 21600] or points not in 10..5000"}
    ),
)
async def timeline(
    pool: str,
    api: Api,
    seconds: float = Query(3600, gt=0, le=6 * 3600, description="how far back"),
    points: int = Query(600, ge=10, le=5000, description="at most this many buckets"),
) -> PoolTimeline:
    """Per tick (bucketed): arrival rate, worst p99, the cap asked, the smallest cap a
    worker serves, the warm cap, the timeout and the desired replicas."""
    control = api.running(pool)
    window = control.loop.timeline.window(time.time(), seconds, points)
    return PoolTimeline.model_validate({"pool": pool, **window})


@routes.get(
    "/v1/pools/{pool}/latency-model",
    access=Access.READ,
    responses=error_responses(when=POOL_READ | {422: "format is not summary or profile"}),
    response_model_exclude_unset=True,
)
async def latency_model(
    pool: str,
    api: Api,
    format: Literal["summary", "profile"] = Query(
        "summary",
        description="summary: per size with its source; profile: the profile JSON "
        "that `simulate --latency-model` loads",
    ),
) -> LatencyModelSummary | LatencyProfile:
    control = api.running(pool)
    return latency_profile(control) if format == "profile" else latency_summary(control)


@routes.get(
    "/v1/pools/{pool}/workers",
    access=Access.READ,
    responses=error_responses(when=POOL_READ | {503: BUS_DOWN}),
)
async def workers(pool: str, api: Api) -> WorkerList:
    control = api.running(pool)
    alive = await bus_call(control.bus.workers_alive(pool))
    return WorkerList(pool=pool, workers=worker_rows(control, alive))


def _moment(text: str, field: str) -> float:
    with contextlib.suppress(ValueError):
        return float(text)
    try:
        return epoch_seconds(datetime.fromisoformat(text))
    except ValueError:
        raise ApiError(422, f"{field}: not Unix seconds or ISO-8601: {text!r}", field) from None
