"""The operator API of the control plane (FastAPI; OpenAPI at /docs).

Reads show each pool's config in force, mode, leader, workers, forecast and the decision
log with its reasons. Writes steer it: a new policy, a pinned config that expires,
declared events, a rollout gate that simulates a candidate policy on the pool's recorded
traffic before promoting it. Writes need the bearer token (compared in constant time);
with no token configured they are refused, never open. Errors are JSON
`{"error": "...", "field": "..."}`.

This module wires the app: the edge (bodies bounded, a write's token checked before its
body is read), the error shape, the routes, the console and the docs. The routes live by
OpenAPI tag (`routes_health`, `routes_pools`, `routes_steer`), their bodies in `schemas`,
what they show of a pool in `pool_views`; they reach the pools through `api_state`, and
`route_table` adds them to each app behind its edge.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import CollectorRegistry

from server.control import routes_health, routes_pools, routes_steer
from server.control.api_state import ControlApi
from server.control.metrics import ControllerMetrics
from server.control.plane import PoolControl
from server.control.route_table import Access, Edge
from server.http_auth import TokenCheck
from server.http_docs import DOCS_APP_ARGS, serve_docs_offline
from server.http_edge import EdgeGuard, EdgeLimits
from server.http_errors import body_refusals, error_responses, install_error_handlers

ROUTES = (routes_health.routes, routes_pools.routes, routes_steer.routes)
"""The operator API's routes, by OpenAPI tag."""
TOKEN_REFUSALS = (401, 403)
"""What a route behind the token answers without the right one."""


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
    app.state.control_api = ControlApi(pools, registry)
    metrics.watch(lambda: pools.values())
    edges = _edges(TokenCheck(token), protect_reads, limits)
    for routes in ROUTES:  # in this order in the OpenAPI, and in a 405's Allow
        routes.add_to(app, edges)
    return app


def _edges(token: TokenCheck, protect_reads: bool, limits: EdgeLimits) -> dict[Access, Edge]:
    """What the edge runs before a route of each access, and documents: the token (and
    its 401 and 403) for writes, and for reads only with --protect-reads; its refusals of
    a body (400, 408, 413) for the writes that take one."""
    behind_token = Edge([Depends(token)], error_responses(*TOKEN_REFUSALS))
    # Every body here is a small JSON document, under the one bound.
    refusals = body_refusals(limits.body_bytes, limits.read_timeout_s)
    return {
        Access.PROBE: Edge(),
        Access.READ: behind_token if protect_reads else Edge(),
        Access.WRITE: behind_token,
        Access.WRITE_BODY: Edge(
            behind_token.dependencies, error_responses(*TOKEN_REFUSALS, when=refusals)
        ),
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
