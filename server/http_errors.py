"""One error shape for every Tidal HTTP API: `{"error": "...", "field": "..."}`.

A client (or an operator with curl) always gets a JSON body naming what was wrong, never
FastAPI's nested default, Starlette's `{"detail": ...}` (an unknown path, a wrong method)
or a traceback. The OpenAPI says so too: `error_responses` documents each status a route
answers with the one `ErrorBody` schema, and `install_error_handlers` drops FastAPI's
guessed 422 (`HTTPValidationError`, a shape never sent).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException
from starlette.routing import Match

from tidal_base.errors import TidalError


class ErrorBody(BaseModel):
    """The body of every error answer (4xx and 5xx) of a Tidal API."""

    error: str = Field(description="what was wrong, in one line")
    field: str | None = Field(
        description="the input it names (a body field, a header, a query or path parameter), "
        "or null when it is the request as a whole"
    )


WHEN: dict[int, str] = {
    401: "no bearer token (answered with WWW-Authenticate: Bearer)",
    403: "a wrong bearer token, or none configured on this server",
    415: "a content type this endpoint does not take",
    422: "a malformed body or parameter; `field` names the first invalid one",
}
"""Each status's description where it means the same on every route; a route says
what the others mean for it (`when=`)."""

HEADERS: dict[int, dict[str, Any]] = {
    401: {"WWW-Authenticate": {"description": "Bearer", "schema": {"type": "string"}}},
    429: {"Retry-After": {"description": "seconds to wait", "schema": {"type": "string"}}},
}


def error_responses(*statuses: int, when: Mapping[int, str] | None = None) -> dict[int, Any]:
    """A route's `responses=` for the error statuses it answers, each with the
    `ErrorBody` schema: `statuses` with their description in `WHEN`, and `when`'s
    statuses with the route's own."""
    described = {status: WHEN[status] for status in statuses} | dict(when or {})
    return {
        status: {"model": ErrorBody, "description": description}
        | ({"headers": HEADERS[status]} if status in HEADERS else {})
        for status, description in sorted(described.items())
    }


def body_refusals(bound_bytes: int, read_timeout_s: float) -> dict[int, str]:
    """What the edge (`server.http_edge.EdgeGuard`) answers a request with a body before
    the app sees it, for `error_responses(when=...)`."""
    return {
        400: "Content-Length is not a byte count, or the JSON body is not UTF-8",
        408: f"the body did not arrive within {read_timeout_s:g} s (--client-timeout)",
        413: f"the body is over {bound_bytes} bytes: refused before it is read",
    }


def error_response(
    status: int, message: str, field: str | None = None, **headers: str
) -> JSONResponse:
    return JSONResponse({"error": message, "field": field}, status_code=status, headers=headers)


LOCATIONS = frozenset({"body", "query", "header", "path", "cookie"})
"""The first element of FastAPI's `loc`: where the input is, not which one it is."""


def first_invalid(error: RequestValidationError | ValidationError) -> JSONResponse:
    """A 422 naming the first invalid field: a body field's path (`events.0.name`), a
    query parameter or a header by its name (`limit`, `x-deadline-ms`), as handlers do."""
    first = error.errors()[0]
    if first.get("type") == "json_invalid":
        return _invalid_json(first)
    loc = list(first.get("loc", ()))
    if loc and loc[0] in LOCATIONS:
        loc = loc[1:]
    field = ".".join(map(str, loc)) or None
    return error_response(422, f"{field or 'body'}: {first.get('msg', 'invalid')}", field)


def _invalid_json(error: Mapping[str, Any]) -> JSONResponse:
    """The body is not JSON. FastAPI puts the decoder's character offset in `loc`, which
    is no field; pydantic's own message already says where (line and column)."""
    position = [p for p in error.get("loc", ()) if isinstance(p, int)]
    where = f" at character {position[0]}" if position else ""
    reason = error.get("ctx", {}).get("error") or error.get("msg", "invalid")
    return error_response(422, f"body: invalid JSON{where}: {reason}")


class ApiError(TidalError):
    """A request refused on purpose (an unknown pool, a follower asked to write, a bad
    token): raised anywhere in a request, answered by its handler as
    `error_response(status, message, field)` with `headers`."""

    def __init__(self, status: int, message: str, field: str | None = None, **headers: str):
        super().__init__(message)
        self.status, self.message, self.field, self.headers = status, message, field, headers


def install_error_handlers(app: FastAPI) -> None:
    """Every error in the one shape, and the OpenAPI without FastAPI's 422 guess."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return first_invalid(error)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error_response(error.status, error.message, error.field, **error.headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> Response:
        return _http_error(request, error)

    @app.exception_handler(Exception)
    async def server_error(request: Request, error: Exception) -> JSONResponse:
        # Starlette logs the traceback and re-raises after this answer; the client
        # learns only that it was not its fault.
        return error_response(500, f"internal error: {type(error).__name__}")

    _document_declared_errors_only(app)


def _http_error(request: Request, error: HTTPException) -> Response:
    """Starlette's own refusals (an unknown path, a wrong method, a body that is not
    UTF-8) in the one shape, their headers (405's Allow) kept."""
    headers = dict(error.headers or {})
    if error.status_code in (204, 304):  # no body allowed
        return Response(status_code=error.status_code, headers=headers)
    message = str(error.detail)
    if error.status_code == 400 and isinstance(error.__cause__, UnicodeDecodeError):
        # FastAPI's "There was an error parsing the body" says neither where nor what.
        message = f"body: not UTF-8 ({error.__cause__})"
    elif error.status_code == 404:
        message = f"no such path: {request.url.path}"
    elif error.status_code == 405:
        headers.pop("allow", None)
        headers["Allow"] = _allowed_methods(request)
        message = (
            f"{request.method} is not allowed on {request.url.path} (allowed: {headers['Allow']})"
        )
    return error_response(error.status_code, message, None, **headers)


def _allowed_methods(request: Request) -> str:
    """Every method some route takes on this path: Starlette's Allow names only the
    first route's (a path with PUT and DELETE routes answered `Allow: PUT`)."""
    methods: dict[str, None] = {}  # in route order, each once
    for route in request.app.router.routes:
        taken = getattr(route, "methods", None)  # None: a mount, which takes any
        if taken and route.matches(request.scope)[0] is Match.PARTIAL:
            methods.update(dict.fromkeys(sorted(taken)))
    return ", ".join(methods)


def _document_declared_errors_only(app: FastAPI) -> None:
    """Drop the 422 that FastAPI adds to every route with a parameter (its
    `HTTPValidationError`, never sent here) along with its schemas.

    Why here rather than a 422 on each route only: FastAPI adds its guess to any route
    with a parameter that does not declare 422, even where nothing can fail (a `{pool}`
    path). Each route declares the errors it answers (`error_responses`), so the OpenAPI
    says exactly that; tests/test_api_schema.py checks every status sent is declared."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _without_validation_guess(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _without_validation_guess(schema: dict[str, Any]) -> dict[str, Any]:
    guessed = "#/components/schemas/HTTPValidationError"
    for path in schema.get("paths", {}).values():
        for operation in path.values():
            responses = operation.get("responses", {})
            content = responses.get("422", {}).get("content", {}).get("application/json", {})
            if content.get("schema", {}).get("$ref") == guessed:
                del responses["422"]
    schemas = schema.get("components", {}).get("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    return schema
