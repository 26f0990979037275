"""A worker's front-end process: HTTP and input decoding, off the model process.

`tidal worker --frontends N` starts N of these beside the process that batches and runs
the model (`server.worker.frontends`). Each accepts connections on the worker's port
(the listening socket is shared; the kernel spreads connections), parses HTTP with
uvicorn's C parser on uvloop, and for `POST /v1/infer` does the CPU work of a request
itself: the body bounds (`server.http_edge`), the headers, the JSON or binary decoding
and the model's input validation (`server.worker.inference.parse_request`). The ready
tensor goes to the model process through a shared-memory slot (`server.worker.handoff`),
whose answer comes back as the HTTP status and JSON body to send. Every other path
(health, stats, config, metrics, docs) is forwarded as it came to the model process's
own API on a Unix socket, so there is one source of truth for each. That API also
decides which requests need the token: one with a body is first shown to it as its head
alone (`TokenFirst`), so a missing or wrong token is refused before a byte of the body
is read, as without front ends (`server.http_edge`).

A front end whose model process goes away answers what it holds 503 and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import time
from collections import deque
from dataclasses import dataclass

import h11
import httpx
import torch
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from server.http_edge import EdgeGuard, EdgeLimits, uvicorn_config
from server.worker import handoff
from server.worker.inference import Answer, Parsed, parse_request, refusal
from server.worker.models import load_codec

log = logging.getLogger("tidal.worker.frontend")

STATS_EVERY_S = 1.0
GONE = refusal(503, "the worker's model process is gone").body
# Hop-by-hop and framing headers: each side of the forward sets its own.
_NOT_FORWARDED = {b"host", b"connection", b"content-length", b"transfer-encoding", b"keep-alive"}
# What a request's head, shown alone, does not carry on: its own Host, Expect and framing.
_NOT_ASKED = {b"host", b"connection", b"keep-alive", b"expect", b"transfer-encoding"}


@dataclass(frozen=True, slots=True)
class FrontendSpec:
    """What a front-end process is started with (sent to it pickled)."""

    index: int
    model: str  # the model's spec, for its input codec
    handoff_path: str  # the model process's Unix socket for requests
    api_path: str  # the model process's own HTTP API, for every other path
    arena: str  # the shared-memory block of this front end's slots
    slots: int
    slot_bytes: int
    limits: EdgeLimits
    client_timeout_s: float


def run_frontend(spec: FrontendSpec, listening: socket.socket) -> None:
    """The process's entry point: serve until SIGTERM (or the model process is gone)."""
    torch.set_num_threads(1)  # decoding is per request: no intra-op pool to spin
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per forwarded request
    app = FrontendApp(spec)
    guarded = EdgeGuard(app, limits=spec.limits, routes=list)  # the bounds
    checked = TokenFirst(guarded, spec.api_path, spec.limits.read_timeout_s)  # before them
    config = uvicorn_config(checked, spec.client_timeout_s, lifespan="on")
    uvicorn.Server(config).run(sockets=[listening])


class ModelLink:
    """The front end's side of the hand-off: a slot, a frame, an awaited answer."""

    def __init__(self, spec: FrontendSpec) -> None:
        self.spec = spec
        self.arena = handoff.SlotArena.attach(spec.arena, spec.slots, spec.slot_bytes)
        self._free: deque[int] = deque()  # filled once the model process says what is held
        self._pending: dict[int, tuple[asyncio.Future[tuple[int, bytes]], int]] = {}
        self._ids = itertools.count()
        self.requests = 0
        self._writer: handoff.FrameWriter | None = None
        self._splitter = handoff.FrameSplitter()
        self._tasks: list[asyncio.Task] = []

    async def connect(self) -> None:
        reader, writer = await asyncio.open_unix_connection(self.spec.handoff_path)
        self._writer = handoff.FrameWriter(writer)
        self._writer.write(handoff.encode_hello(self.spec.index))
        welcome, *after = await handoff.read_frames(reader, self._splitter)
        if handoff.kind_of(welcome) != handoff.WELCOME:
            raise ConnectionError(f"the model process answered HELLO with {welcome[:1]!r}")
        held = set(handoff.decode_welcome(welcome))  # an earlier process's queued requests
        self._free = deque(slot for slot in range(self.spec.slots) if slot not in held)
        for payload in after:  # releases sent in the same write
            self._received(payload)
        self._tasks = [
            asyncio.create_task(self._read_answers(reader), name="frontend-answers"),
            asyncio.create_task(self._report_stats(), name="frontend-stats"),
        ]

    async def submit(self, parsed: Parsed) -> tuple[int, bytes]:
        """The model process's (status, JSON body) for this request."""
        self.requests += 1
        if self._writer is None or self._writer.is_closing():
            return 503, json.dumps(GONE).encode()
        tensor: torch.Tensor = parsed.item
        slot = self._free.popleft() if self._free and self.arena.fits(tensor) else handoff.INLINE
        if slot != handoff.INLINE:
            self.arena.write(slot, tensor)
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (future, slot)
        request = handoff.RequestFrame(
            request_id,
            slot,
            tensor.dtype,
            tuple(tensor.shape),
            parsed.deadline_ms,
            parsed.origin_wall_s,
            parsed.stamped,
            handoff.inline_bytes(tensor) if slot == handoff.INLINE else b"",
        )
        self._writer.write(handoff.encode_request(request))
        return await future

    async def _read_answers(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                for payload in await handoff.read_frames(reader, self._splitter):
                    self._received(payload)
        except (asyncio.IncompleteReadError, ConnectionError):
            self._model_process_gone()

    def _received(self, payload: bytes) -> None:
        if handoff.kind_of(payload) == handoff.RELEASE:
            self._free.append(handoff.decode_release(payload))  # an earlier one's
        else:
            self._answered(*handoff.decode_answer(payload))

    def _answered(self, request_id: int, status: int, body: bytes) -> None:
        future, slot = self._pending.pop(request_id)
        if slot != handoff.INLINE:
            self._free.append(slot)  # the batch that read it has run
        if not future.done():
            future.set_result((status, body))

    def _model_process_gone(self) -> None:
        """Nothing held would ever be answered: answer it 503, and stop serving."""
        log.error("front end %d: the model process closed the hand-off; exiting", self.spec.index)
        gone = json.dumps(GONE).encode()
        for future, _ in self._pending.values():
            if not future.done():
                future.set_result((503, gone))
        self._pending.clear()
        if self._writer is not None:
            self._writer.close()
        os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown

    async def _report_stats(self) -> None:
        while self._writer is not None and not self._writer.is_closing():
            self._writer.write(handoff.encode_stats(time.process_time(), self.requests))
            await asyncio.sleep(STATS_EVERY_S)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._writer is not None and not self._writer.is_closing():
            # The last count, so the model process's totals include this front end's end.
            self._writer.write(handoff.encode_stats(time.process_time(), self.requests))
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()
        self.arena.close()


class FrontendApp:
    """The front end's ASGI app: `POST /v1/infer` handed off, everything else forwarded."""

    def __init__(self, spec: FrontendSpec) -> None:
        self.spec = spec
        self.codec = load_codec(spec.model)
        self.link = ModelLink(spec)
        self.api: httpx.AsyncClient | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] != "http":
            return
        elif scope["path"] == "/v1/infer" and scope["method"] == "POST":
            await self._infer(scope, receive, send)
        else:
            await self._forward(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.link.connect()
                transport = httpx.AsyncHTTPTransport(uds=self.spec.api_path)
                self.api = httpx.AsyncClient(transport=transport, base_url="http://worker")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.link.close()
                if self.api is not None:
                    await self.api.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _infer(self, scope: Scope, receive: Receive, send: Send) -> None:
        handled_wall_s = time.time()
        headers = _headers(scope, (b"content-type", b"x-deadline-ms", b"x-sent-at"))
        parsed = parse_request(
            self.codec,
            headers.get(b"content-type", ""),
            await _body(receive),
            headers.get(b"x-deadline-ms"),
            headers.get(b"x-sent-at"),
            handled_wall_s,
        )
        if isinstance(parsed, Answer):
            await _respond(send, parsed.status, json.dumps(parsed.body).encode())
            return
        status, body = await self.link.submit(parsed)
        await _respond(send, status, body)

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.api is not None
        headers = [(k, v) for k, v in scope["headers"] if k not in _NOT_FORWARDED]
        query = scope.get("query_string", b"").decode("latin-1")
        try:
            reply = await self.api.request(
                scope["method"],
                scope["path"] + (f"?{query}" if query else ""),
                headers=headers,
                content=await _body(receive),
            )
        except httpx.TransportError as error:  # starting, or gone: say so, in the API's shape
            message = f"the worker's model process did not answer ({error!r})"
            await _respond(send, 503, json.dumps(refusal(503, message).body).encode())
            return
        forwarded = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in reply.headers.multi_items()
            if k.encode("latin-1") not in _NOT_FORWARDED
        ]
        body = reply.content
        forwarded.append((b"content-length", str(len(body)).encode()))
        await send(
            {"type": "http.response.start", "status": reply.status_code, "headers": forwarded}
        )
        await send({"type": "http.response.body", "body": body})


class TokenFirst:
    """ASGI middleware, a front end's outermost: the token before the body.

    The model process's API knows which of its routes need the token and checks it
    before it reads a body (`server.http_edge.EdgeGuard`); a front end holds neither its
    routes nor its token. So a request for that API that carries a body is first shown
    to it as its head alone, with `Expect: 100-continue`: its refusal (401, 403, 413)
    comes back before a byte of the body is read here and goes to the client as it
    came, the connection closed; its `100 Continue` lets the request on, to be read and
    forwarded. Inference (`POST /v1/infer`) needs no token and is not asked about."""

    def __init__(self, app: ASGIApp, api_path: str, timeout_s: float) -> None:
        self.app, self.api_path, self.timeout_s = app, api_path, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _forwarded_with_body(scope):
            refused = await self._refusal(scope)
            if refused is not None:
                await _relay(send, *refused)
                return
        await self.app(scope, receive, send)

    async def _refusal(self, scope: Scope) -> tuple[int, list, bytes] | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await ask_head_first(self.api_path, scope)
        except (OSError, TimeoutError, h11.ProtocolError) as error:  # starting, or gone
            message = f"the worker's model process did not answer ({error!r})"
            return 503, [(b"content-type", b"application/json")], _json(refusal(503, message))


def _forwarded_with_body(scope: Scope) -> bool:
    if scope["path"] == "/v1/infer" and scope["method"] == "POST":
        return False
    headers = dict(scope["headers"])
    length = headers.get(b"content-length", b"0")
    if not length.isdigit():
        return False  # no body to protect: EdgeGuard answers 400 from the head
    return b"transfer-encoding" in headers or int(length) > 0


async def ask_head_first(api_path: str, scope: Scope) -> tuple[int, list, bytes] | None:
    """The API's answer to the request's head alone: None when it wants the body (`100
    Continue`), else its refusal's (status, headers, body)."""
    reader, writer = await asyncio.open_unix_connection(api_path)
    try:
        connection = h11.Connection(h11.CLIENT)
        writer.write(connection.send(_head_alone(scope)))
        return await _first_answer(connection, reader)
    finally:
        writer.close()  # a request it let on is never sent: it sees the client leave


def _head_alone(scope: Scope) -> h11.Request:
    headers = [(k, v) for k, v in scope["headers"] if k not in _NOT_ASKED]
    if any(k == b"transfer-encoding" for k, _ in scope["headers"]):
        headers.append((b"transfer-encoding", b"chunked"))  # what it is framed as
        headers = [(k, v) for k, v in headers if k != b"content-length"]
    query = scope.get("query_string", b"")
    target = scope["path"].encode("latin-1") + (b"?" + query if query else b"")
    expect = [(b"host", b"worker"), (b"expect", b"100-continue")]
    return h11.Request(method=scope["method"], target=target, headers=headers + expect)


async def _first_answer(
    connection: h11.Connection, reader: asyncio.StreamReader
) -> tuple[int, list, bytes] | None:
    head: tuple[int, list] | None = None
    body = []
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await reader.read(65536))
        elif isinstance(event, h11.InformationalResponse):
            return None  # 100 Continue: it would read the body
        elif isinstance(event, h11.Response):
            head = event.status_code, list(event.headers)
        elif isinstance(event, h11.Data):
            body.append(event.data)
        elif isinstance(event, h11.EndOfMessage) and head is not None:
            return *head, b"".join(body)
        else:
            raise ConnectionError(f"the model process's API closed without an answer ({event})")


async def _relay(send: Send, status: int, headers: list, body: bytes) -> None:
    """A refusal as the model process's API gave it, and the connection closed: the
    rest of the request's body is not read."""
    kept = [(k, v) for k, v in headers if k.lower() not in _NOT_FORWARDED]
    kept += [(b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": status, "headers": kept})
    await send({"type": "http.response.body", "body": body})


def _json(answer: Answer) -> bytes:
    return json.dumps(answer.body).encode()


def _headers(scope: Scope, wanted: tuple[bytes, ...]) -> dict[bytes, str]:
    return {k: v.decode("latin-1") for k, v in scope["headers"] if k in wanted}


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _respond(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 429:
        headers.append((b"retry-after", b"1"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
