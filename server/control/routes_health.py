"""The control plane's health routes (tag `health`): liveness and readiness (probes,
never behind the token) and the Prometheus scrape (a read).
"""

from __future__ import annotations

from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.control.api_state import Api
from server.control.pool_views import pool_health
from server.control.route_table import Access, RouteTable
from server.control.schemas import Health, Readiness

routes = RouteTable("health")


@routes.get("/healthz", access=Access.PROBE)
async def healthz() -> Health:
    return Health(status="ok")


@routes.get(
    "/readyz",
    access=Access.PROBE,
    responses={
        200: {"model": Readiness, "description": "every pool ticks"},
        503: {"model": Readiness, "description": "a pool is starting, or fails to tick"},
    },
)
async def readyz(api: Api) -> Response:
    # Its status is the answer (200 or 503), so it serializes its `Readiness` itself.
    health = {name: pool_health(control) for name, control in api.pools.items()}
    waiting = [f"{name} ({h.status})" for name, h in health.items() if not h.ready]
    body = Readiness(
        status="not ready" if waiting else "ready",
        error=f"not ready: {', '.join(waiting)}" if waiting else None,
        pools=health,
    )
    return JSONResponse(
        body.model_dump(mode="json", exclude_unset=True), status_code=503 if waiting else 200
    )


@routes.get(
    "/metrics",
    access=Access.READ,
    response_class=PlainTextResponse,
    responses={200: {"description": "Prometheus text exposition (version 0.0.4)"}},
)
async def prometheus(api: Api) -> Response:
    return Response(generate_latest(api.registry), media_type=CONTENT_TYPE_LATEST)
