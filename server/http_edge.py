"""What every Tidal HTTP API refuses before its handlers run: bodies past a bound, writes
without the token, and clients too slow to send their request.

Measured before this existed (docs/benchmarks.md, faults): one 500 MB JSON body aborted a
worker (`MemoryError`), and an unauthenticated 500 MB body to a controller write froze its
API, control loop and in-process workers for 42 s before the 401; a client sending one
byte every 5 s held its connection forever. FastAPI reads and parses a body before its
dependencies run, so the bound and the token check live below it, in ASGI:

- `EdgeGuard` (middleware) answers 413 at once when `Content-Length` is over the route's
  bound, 401/403 when a protected route's request has no right token (before a byte of
  the body is read), 413 as soon as a chunked body passes the bound, and 408 when the body
  does not arrive within `read_timeout_s`. It buffers the body (the app would anyway) and
  replays it to the app, so handlers are unchanged.
- `DeadlineHttpProtocol` (uvicorn's httptools protocol) closes a connection whose request
  head has not arrived within `header_timeout_s` of its first byte (or of the connection):
  uvicorn's own keep-alive timeout stops counting once any byte arrives.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi.routing import APIRoute
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from server.http_auth import TokenCheck

MiB = 1 << 20
SMALL_BODY_BYTES = 64 << 10
"""The bound of a body that is only a small JSON document (a config, a policy)."""


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """Bounds at the edge: body bytes per path (exact match; the rest take the default)
    and how long a client may take to send its body."""

    body_bytes: int = MiB
    body_bytes_by_path: Mapping[str, int] = field(default_factory=dict)
    read_timeout_s: float = 10.0

    def bound(self, path: str) -> int:
        return self.body_bytes_by_path.get(path, self.body_bytes)


class EdgeGuard:
    """ASGI middleware: `app.add_middleware(EdgeGuard, limits=..., routes=lambda: app.routes)`.

    `routes` is read at the first request (routes are added after the middleware): a route
    is protected when one of its dependencies is a `TokenCheck`, which this asks first."""

    def __init__(self, app: ASGIApp, limits: EdgeLimits, routes: Callable[[], list]) -> None:
        self.app, self.limits, self._routes = app, limits, routes
        self._protected: list[tuple[APIRoute, TokenCheck]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            await _respond(send, *refusal)
            return
        bound = self.limits.bound(scope["path"])
        body = await self._read_body(receive, bound)
        if isinstance(body, tuple):
            if body[0]:  # nothing to answer a client that left
                await _respond(send, *body)
            return
        await self.app(scope, _replay(body, receive), send)

    def _refusal(self, scope: Scope) -> tuple[int, str, str | None] | None:
        check = self._token_check(scope)  # first: a stranger learns nothing of the bounds
        if check is not None:
            error = check.refusal(_header(scope, b"authorization"))
            if error is not None:
                return error.status, error.message, error.field
        length = _header(scope, b"content-length")
        bound = self.limits.bound(scope["path"])
        if length is not None:
            if not length.isdigit():
                return 400, f"Content-Length must be a byte count, got {length!r}", "content-length"
            if int(length) > bound:
                return 413, _too_large(int(length), bound), "content-length"
        return None

    def _token_check(self, scope: Scope) -> TokenCheck | None:
        if self._protected is None:
            self._protected = [
                (route, dependency.call)
                for route in self._routes()
                if isinstance(route, APIRoute)
                for dependency in route.dependant.dependencies
                if isinstance(dependency.call, TokenCheck)
            ]
        for route, check in self._protected:
            if route.matches(scope)[0] is Match.FULL:
                return check
        return None

    async def _read_body(self, receive: Receive, bound: int) -> bytes | tuple[int, str, str | None]:
        """The whole body, or (status, message, field) to refuse it with (status 0: the
        client disconnected)."""
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.limits.read_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return 0, "", None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > bound:
                        return 413, _too_large(size, bound, read_so_far=True), None
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            message = (
                f"the request body did not arrive within {self.limits.read_timeout_s:g} s "
                f"({size} bytes read)"
            )
            return 408, message, None


def _too_large(size: int, bound: int, read_so_far: bool = False) -> str:
    what = f"more than {bound} bytes sent" if read_so_far else f"{size} bytes"
    return f"request body too large: {what}; this endpoint takes at most {bound} bytes"


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # the disconnect, when the app waits for one

    return replayed


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


async def _respond(send: Send, status: int, message: str, field: str | None) -> None:
    """The error shape of every Tidal API (`server.http_errors`), and the connection closed:
    the rest of a refused body is not read."""
    body = json.dumps({"error": message, "field": field}).encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class DeadlineHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request head: a connection
    that has not sent a complete request line and headers within `header_timeout_s` of
    opening (or of its next request's first byte) is closed."""

    header_timeout_s = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        self._disarm()
        self._head_deadline = self.loop.call_later(self.header_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _expire(self) -> None:
        self._head_deadline = None
        if not self.transport.is_closing():
            self.transport.close()


def uvicorn_config(app: ASGIApp, header_timeout_s: float = 10.0, **kwargs: Any):
    """uvicorn's Config for a Tidal API: request heads on a deadline, quiet logs, a 30 s
    drain."""
    import uvicorn

    protocol = type(
        "DeadlineHttpProtocol", (DeadlineHttpProtocol,), {"header_timeout_s": header_timeout_s}
    )
    kwargs.setdefault("log_level", "warning")
    kwargs.setdefault("timeout_graceful_shutdown", 30)
    return uvicorn.Config(app, http=protocol, **kwargs)
