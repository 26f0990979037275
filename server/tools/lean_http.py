"""Keep-alive HTTP/1.1 POSTs for open-loop load, lean enough to share the cores with the
server they measure.

Tidal's load generators run on the same machine as the workers they drive, so every
CPU-millisecond the client spends is taken from the server it measures. httpx costs
1.3-7.1 ms of CPU a request here (a task, a coroutine chain and a response object per
request, more as the load rises); this path 0.13-0.28 ms (docs/benchmarks.md, "The load
generator's cost"): a request is one write of bytes encoded up front, its answer is
parsed by httptools (llhttp, the C parser uvicorn serves with), and a connection carries
one request at a time and then returns to its target's idle stack.

`Endpoint.post(data, done, timeout_s)` calls `done(status, body)` exactly once: the
answer's status and body, or -1 with no body when the connection could not be opened,
failed or the answer did not come within `timeout_s` (the connection is then aborted).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import httptools

Done = Callable[[int, bytes], None]

IDLE_REUSE_S = 2.0
"""An idle connection older than this is closed rather than reused: uvicorn closes a
keep-alive connection after 5 s idle, and a request written as the server closes it
would fail for the client's reason, not the server's."""


class PostRequest:
    """POSTs to one URL, one per payload, encoded once. With `stamp_sent_at`, each carries
    `X-Sent-At` (Unix seconds when written), from which a Tidal worker measures the time
    a request waited before its handler (`ingress_ms`)."""

    def __init__(
        self, url: str, payloads: Sequence[bytes], content_type: str, stamp_sent_at: bool = False
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"url must be http://host:port/path, got {url!r}")
        if not payloads:
            raise ValueError("at least one payload is needed")
        self.host, self.port = parts.hostname, parts.port or 80
        self.stamp_sent_at = stamp_sent_at
        head = (
            f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {{}}\r\n"
        )
        # Head (open: the stamp goes last) and body of each payload.
        self._parts = [(head.format(len(p)).encode(), bytes(p)) for p in payloads]

    def encode(self, index: int) -> bytes:
        """The request for payload `index` (taken modulo the payloads), ready to write."""
        head, body = self._parts[index % len(self._parts)]
        if self.stamp_sent_at:
            return b"".join((head, b"X-Sent-At: %.6f\r\n\r\n" % time.time(), body))
        return b"".join((head, b"\r\n", body))


class Endpoint:
    """One server's keep-alive connections: idle ones are reused last-in first-out, and
    a new one opens when none is idle (so at most as many as requests in flight). One
    idle for `idle_reuse_s` or longer is closed rather than reused."""

    def __init__(self, host: str, port: int, idle_reuse_s: float = IDLE_REUSE_S) -> None:
        self.host, self.port = host, port
        self.idle_reuse_s = idle_reuse_s
        self._idle: list[_Exchange] = []
        self._open: set[_Exchange] = set()
        self._connecting: set[asyncio.Task[None]] = set()

    def post(self, data: bytes, done: Done, timeout_s: float) -> None:
        """Write `data` on an idle connection (or a new one); `done` gets the answer."""
        loop = asyncio.get_running_loop()
        exchange = self._take_idle(loop.time())
        if exchange is None:
            task = loop.create_task(self._connect_and_send(data, done, timeout_s))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)
        else:
            exchange.send(data, done, timeout_s)

    def close(self) -> None:
        """Abort every connection, and every one being opened (their requests answer -1)."""
        for task in list(self._connecting):
            task.cancel()
        for exchange in list(self._open):
            exchange.abort()
        self._idle.clear()

    def _take_idle(self, now: float) -> _Exchange | None:
        while self._idle:
            exchange = self._idle.pop()
            if exchange.usable(now):
                return exchange
            exchange.abort()
        return None

    async def _connect_and_send(self, data: bytes, done: Done, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, exchange = await asyncio.wait_for(
                loop.create_connection(lambda: _Exchange(self), self.host, self.port), timeout_s
            )
        except (OSError, TimeoutError):
            done(-1, b"")
            return
        except asyncio.CancelledError:
            done(-1, b"")
            raise
        exchange.send(data, done, timeout_s)

    def _opened(self, exchange: _Exchange) -> None:
        self._open.add(exchange)

    def _idle_again(self, exchange: _Exchange) -> None:
        self._idle.append(exchange)

    def _closed(self, exchange: _Exchange) -> None:
        self._open.discard(exchange)


class _Exchange(asyncio.Protocol):
    """One connection carrying one request at a time. httptools calls the `on_*` methods
    as it parses the answer."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.done: Done | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.idle_since = 0.0
        self.keep_alive = True
        self.closed = False

    def usable(self, now: float) -> bool:
        fresh = now - self.idle_since < self.endpoint.idle_reuse_s
        return not self.closed and self.keep_alive and fresh

    def send(self, data: bytes, done: Done, timeout_s: float) -> None:
        if self.closed or self.transport is None:  # lost between its connect and now
            done(-1, b"")
            return
        assert self.done is None, "one request at a time on a connection"
        self.done = done
        self.timer = asyncio.get_running_loop().call_later(timeout_s, self.abort)
        self.transport.write(data)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        self.endpoint._opened(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.abort()  # connection_lost answers -1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.endpoint._closed(self)
        self._finish(-1, b"")

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()
        body, self.body = b"".join(self.body), []
        self.idle_since = asyncio.get_running_loop().time()
        if self.keep_alive:  # idle before `done` runs, which may post again at once
            self.endpoint._idle_again(self)
        self._finish(status, body)
        if not self.keep_alive:
            self.abort()

    def _finish(self, status: int, body: bytes) -> None:
        done, self.done = self.done, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if done is not None:
            done(status, body)
