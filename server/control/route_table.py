"""Routes declared once, at import, and added to each app behind the edge it runs.

A route module declares its handlers with a `RouteTable`'s decorators, as with FastAPI's
`APIRouter`, naming each route's `Access`: `@routes.get(path, access=Access.READ, ...)`.
What the edge does for an access differs from app to app (the token, whether reads need
it, the body bound its 413 documents), so `create_app` adds each table with an `Edge` per
access: `table.add_to(app, edges)`.

Why not `APIRouter` and `include_router`: FastAPI (0.165) includes a router as one
nested entry resolved per request, not as routes of the app, and the edge reads the app's
routes as they are (`server.http_edge.EdgeGuard` finds the routes behind a `TokenCheck`
there, to refuse before a body is read; a 405's Allow lists the methods of the routes
matching the path). Added here, each route is an `APIRoute` of the app itself.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from fastapi.params import Depends

Endpoint = Callable[..., Any]


class Access(enum.Enum):
    """Who may call a route, and what it sends."""

    PROBE = "probe"
    """Never needs the token: an orchestrator's probes carry none."""
    READ = "read"
    """Needs the token only where reads are protected (--protect-reads)."""
    WRITE = "write"
    """Needs the token; takes no body."""
    WRITE_BODY = "write with a body"
    """Needs the token and takes a JSON body (bounded at the edge)."""


@dataclass(frozen=True, slots=True)
class Edge:
    """What an app runs before a route's handler (`dependencies`, first) and what it
    documents the route answers for it (`responses`, the route's own take precedence)."""

    dependencies: Sequence[Depends] = ()
    responses: Mapping[int, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Declared:
    path: str
    method: str
    access: Access
    endpoint: Endpoint
    options: dict[str, Any]


@dataclass(slots=True)
class RouteTable:
    """The routes of one OpenAPI tag, in declaration order."""

    tag: str
    _routes: list[_Declared] = field(default_factory=list)

    def get(self, path: str, access: Access, **options: Any) -> Callable[[Endpoint], Endpoint]:
        return self._declare("GET", path, access, options)

    def put(self, path: str, access: Access, **options: Any) -> Callable[[Endpoint], Endpoint]:
        return self._declare("PUT", path, access, options)

    def post(self, path: str, access: Access, **options: Any) -> Callable[[Endpoint], Endpoint]:
        return self._declare("POST", path, access, options)

    def delete(self, path: str, access: Access, **options: Any) -> Callable[[Endpoint], Endpoint]:
        return self._declare("DELETE", path, access, options)

    def _declare(
        self, method: str, path: str, access: Access, options: dict[str, Any]
    ) -> Callable[[Endpoint], Endpoint]:
        """A decorator; `options` are `FastAPI.add_api_route`'s (responses, ...)."""

        def declare(endpoint: Endpoint) -> Endpoint:
            self._routes.append(_Declared(path, method, access, endpoint, options))
            return endpoint

        return declare

    def add_to(self, app: FastAPI, edges: Mapping[Access, Edge]) -> None:
        """Add every route to `app` behind the edge of its access."""
        for route in self._routes:
            edge = edges[route.access]
            options = dict(route.options)
            responses = {**edge.responses, **options.pop("responses", {})}
            app.add_api_route(
                route.path,
                route.endpoint,
                methods=[route.method],
                tags=[self.tag],
                dependencies=[*edge.dependencies, *options.pop("dependencies", ())],
                responses=dict(sorted(responses.items(), key=lambda item: int(item[0]))),
                **options,
            )
