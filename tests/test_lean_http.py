"""The load generator's HTTP client (`server.tools.lean_http`) and `tidal loadgen`'s replay
on it, against a real asyncio server on loopback that answers as the test scripts it:
lengths or chunks, answers cut into arbitrary pieces, closes, silence, garbage.

Each post must be answered exactly once; keep-alive connections are reused and a closed
or stale one never is; a replay returns one result per arrival, in arrival order."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.tools.lean_http import Endpoint, PostRequest
from server.tools.loadgen import replay

Answer = Callable[[bytes], list[bytes] | None]
"""Given a request's body, the answer's pieces to write (None: close without answering,
[]: say nothing)."""


def json_answer(status: int = 200, keep_alive: bool = True) -> Answer:
    def answer(body: bytes) -> list[bytes]:
        payload = json.dumps({"echo": len(body), "timing": {"batch_size": 3}}).encode()
        close = b"" if keep_alive else b"Connection: close\r\n"
        head = b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n" % (status, len(payload), close)
        return [head + payload]

    return answer


def chunked_answer(pieces: list[bytes]) -> Answer:
    def answer(body: bytes) -> list[bytes]:
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces if p)
        return [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"]

    return answer


@dataclass
class ScriptedServer:
    """Answers each request with `answer(body)`, its bytes cut at `cuts` (offsets) and
    written piece by piece with a pause between; counts connections and requests."""

    answer: Answer
    cuts: tuple[int, ...] = ()
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    server: asyncio.base_events.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/infer"

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                pieces = self.answer(body)
                if pieces is None:
                    break
                await self._write(writer, b"".join(pieces))
                if b"connection: close" in b"".join(pieces).lower():
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        at = 0
        for cut in sorted(c for c in self.cuts if 0 < c < len(data)):
            writer.write(data[at:cut])
            await writer.drain()
            await asyncio.sleep(0.001)
            at = cut
        writer.write(data[at:])
        await writer.drain()


async def post_all(
    server: ScriptedServer, bodies: list[bytes], timeout_s: float = 5.0, **endpoint
) -> list[tuple[int, bytes]]:
    """Post each body in turn (the next once the last is answered); every answer."""
    url = await server.start()
    request = PostRequest(url, bodies, "application/octet-stream")
    target = Endpoint(request.host, request.port, **endpoint)
    answers: list[tuple[int, bytes]] = []
    try:
        for i in range(len(bodies)):
            answered = asyncio.get_running_loop().create_future()
            target.post(request.encode(i), lambda s, b, f=answered: f.set_result((s, b)), timeout_s)
            answers.append(await answered)
    finally:
        target.close()
        await server.stop()
    return answers


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.integers(1, 120), max_size=6).map(tuple),
    pieces=st.lists(st.binary(min_size=1, max_size=20), min_size=1, max_size=4),
    chunked=st.booleans(),
)
def test_an_answer_cut_anywhere_is_read_whole_once(cuts, pieces, chunked):
    answer = chunked_answer(pieces) if chunked else json_answer()
    server = ScriptedServer(answer, cuts)
    answers = asyncio.run(post_all(server, [b"a" * 7, b"b" * 9, b"c"]))
    expected = (
        [b"".join(pieces)] * 3
        if chunked
        else [json.dumps({"echo": n, "timing": {"batch_size": 3}}).encode() for n in (7, 9, 1)]
    )
    assert answers == [(200, body) for body in expected]
    assert server.connections == 1  # kept alive throughout


def test_a_connection_the_server_closes_is_not_reused():
    server = ScriptedServer(json_answer(503, keep_alive=False))
    answers = asyncio.run(post_all(server, [b"x", b"y", b"z"]))
    assert [status for status, _ in answers] == [503, 503, 503]
    assert server.connections == 3


def test_an_idle_connection_past_its_reuse_age_is_replaced():
    server = ScriptedServer(json_answer())
    answers = asyncio.run(post_all(server, [b"x", b"y"], idle_reuse_s=0.0))
    assert [status for status, _ in answers] == [200, 200]
    assert server.connections == 2


def test_silence_past_the_timeout_and_a_dropped_connection_answer_minus_one():
    silent = ScriptedServer(lambda body: [])
    assert asyncio.run(post_all(silent, [b"x"], timeout_s=0.2)) == [(-1, b"")]
    dropped = ScriptedServer(lambda body: None)
    assert asyncio.run(post_all(dropped, [b"x", b"y"])) == [(-1, b""), (-1, b"")]
    garbage = ScriptedServer(lambda body: [b"NOT HTTP AT ALL\r\n\r\n"])
    assert asyncio.run(post_all(garbage, [b"x"])) == [(-1, b"")]


def test_nothing_listening_answers_minus_one():
    async def refused() -> tuple[int, bytes]:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        answered = asyncio.get_running_loop().create_future()
        Endpoint("127.0.0.1", port).post(b"", lambda s, b: answered.set_result((s, b)), 1.0)
        return await answered

    assert asyncio.run(refused()) == (-1, b"")


def test_the_stamp_is_the_time_of_writing():
    import time

    request = PostRequest("http://127.0.0.1:1/v1/infer", [b"abc"], "text/plain", True)
    data = request.encode(5)
    head, body = data.split(b"\r\n\r\n")
    stamp = float(head.split(b"X-Sent-At: ")[1])
    assert body == b"abc" and abs(stamp - time.time()) < 5
    assert b"Content-Length: 3\r\n" in head and head.startswith(b"POST /v1/infer HTTP/1.1")


def test_replay_returns_one_result_per_arrival_in_order_with_the_workers_timing():
    answers = iter([json_answer(200), json_answer(429), json_answer(200)] * 100)
    server = ScriptedServer(lambda body: next(answers)(body))
    times = np.linspace(0.0, 0.3, 30)

    async def run():
        url = await server.start()
        try:
            return await replay(url.removesuffix("/v1/infer"), times, [b"p"], 100)
        finally:
            await server.stop()

    results = asyncio.run(run())
    assert [r.scheduled_s for r in results] == [float(t) for t in times]
    assert sorted(r.status for r in results) == sorted([200, 429, 200] * 10)
    assert all(r.batch_size == 3 for r in results if r.status == 200)
    assert all(r.batch_size is None for r in results if r.status != 200)
    assert all(r.sent_s >= r.scheduled_s - 0.01 for r in results)
    assert all(b"X-Sent-At: " in request for request in server.requests)


def test_replay_past_the_in_flight_bound_counts_arrivals_as_not_sent():
    server = ScriptedServer(lambda body: [])  # holds every request until the timeout
    times = np.zeros(5)

    async def run():
        url = await server.start()
        try:
            return await replay(url.removesuffix("/v1/infer"), times, [b"p"], 2, timeout_s=0.2)
        finally:
            await server.stop()

    statuses = sorted(r.status for r in asyncio.run(run()))
    assert statuses == [-1, -1, 0, 0, 0]


def test_a_cancelled_replay_sends_nothing_more():
    server = ScriptedServer(json_answer())
    times = np.linspace(0.0, 5.0, 50)

    async def run() -> int:
        url = await server.start()
        sending = asyncio.ensure_future(replay(url.removesuffix("/v1/infer"), times, [b"p"], 10))
        await asyncio.sleep(0.5)
        sending.cancel()
        await asyncio.sleep(0.6)
        sent = len(server.requests)
        await asyncio.sleep(0.5)
        await server.stop()
        assert len(server.requests) == sent
        return sent

    assert 3 <= asyncio.run(run()) <= 15


def test_a_replay_runs_with_the_collector_paused_and_the_heap_before_it_frozen():
    import gc

    from server.tools.loadgen import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
