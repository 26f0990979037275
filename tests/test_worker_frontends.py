"""`tidal worker --frontends 2`: front-end processes parse and decode, one model process
batches (server.worker.frontend, server.worker.frontends, server.worker.handoff).

Real processes: the worker, its two front ends and their shared memory. What must hold:
the one batcher sees every request whichever front end took it, answers are the model's,
refusals are the same as a single process's, every other path reaches the model
process's API, a killed front end is restarted and counted, and a SIGTERM drains.
The whole real-process worker suite also runs through front ends with
`TIDAL_TEST_WORKER_ARGS="--frontends 2" python -m pytest tests/test_worker_http.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import re
import signal
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from processes import wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_http_edge import answer, connect, head
from test_worker_http import AUTH, TOKEN, image, start_worker

from server import ports
from server.http_edge import EdgeLimits
from server.tasks import BackgroundErrors
from server.worker import handoff
from server.worker.frontends import FrontendPool, RestartBackoff
from server.worker.inference import Answer, Parsed
from server.worker.models import load_codec, load_model
from server.worker.runner import TorchRunner
from tidal_base.errors import InvalidInput

BINARY = {"content-type": "application/octet-stream"}


@pytest.fixture(scope="module")
def worker():
    # A long timeout: batches form by size, so a batch of 8 proves one batcher saw all 8.
    process, url = start_worker("--frontends", "2", "--config", "max_batch=8,timeout=2s")
    yield process, url
    process.terminate()
    process.wait(timeout=60)


def frontend_pids(url: str) -> list[int]:
    return [f["pid"] for f in httpx.get(f"{url}/v1/stats").json()["frontends"]]


def metric(url: str, name: str) -> float:
    families = text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
    return sum(s.value for f in families for s in f.samples if s.name == name)


def test_a_handoff_frame_round_trips():
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    arena = handoff.SlotArena.create(4, handoff.slot_bytes_for(tensor))
    try:
        arena.write(2, tensor)
        request = handoff.RequestFrame(7, 2, torch.float32, (3, 4), None, 1.5, True)
        encoded = handoff.encode_request(request)
        (length,) = struct.unpack("<I", encoded[:4])
        decoded = handoff.decode_request(encoded[4 : 4 + length])
        assert decoded == request
        assert torch.equal(arena.view(decoded.slot, decoded.dtype, decoded.shape), tensor)
        inline = handoff.RequestFrame(
            8,
            handoff.INLINE,
            torch.int32,
            (2,),
            250.0,
            2.0,
            False,
            handoff.inline_bytes(torch.tensor([5, 6], dtype=torch.int32)),
        )
        back = handoff.decode_request(handoff.encode_request(inline)[4:])
        assert back == inline and handoff.inline_tensor(back).tolist() == [5, 6]
        assert handoff.decode_answer(handoff.encode_answer(9, 429, b"{}")[4:]) == (9, 429, b"{}")
        assert handoff.decode_welcome(handoff.encode_welcome({5, 2})[4:]) == (2, 5)
        assert handoff.decode_welcome(handoff.encode_welcome(())[4:]) == ()
        assert handoff.decode_release(handoff.encode_release(7)[4:]) == 7
    finally:
        arena.close()


def test_frames_split_out_of_a_stream_in_any_pieces():
    """The reader takes whatever has arrived: frames cut anywhere, or many in one read,
    come out whole and in order."""
    frames = [handoff.encode_answer(i, 200, b"x" * i) for i in range(6)]
    stream = b"".join(frames)
    for cut in (1, 3, 7, 64, len(stream)):
        splitter = handoff.FrameSplitter()
        pieces = [stream[at : at + cut] for at in range(0, len(stream), cut)]
        payloads = [p for piece in pieces for p in splitter.feed(piece)]
        assert [handoff.decode_answer(p) for p in payloads] == [
            (i, 200, b"x" * i) for i in range(6)
        ]


def test_one_batcher_batches_requests_from_both_front_ends(worker):
    _, url = worker
    inputs = [image(i) for i in range(8)]

    def send(i: int) -> dict:  # a client (so a connection) each: the kernel spreads them
        with httpx.Client(timeout=30) as client:
            body = torch.tensor(inputs[i]).numpy().tobytes()
            return client.post(f"{url}/v1/infer", content=body, headers=BINARY).json()

    before = httpx.get(f"{url}/v1/stats").json()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(send, range(8)))
    assert {a["timing"]["batch_size"] for a in answers} == {8}
    model = load_model("demo-cnn")
    expected = TorchRunner(model).run([model.validate(x) for x in inputs], 8)
    for got, want in zip(answers, expected, strict=True):
        assert got["output"] == pytest.approx(want, abs=1e-4)
    assert httpx.get(f"{url}/v1/stats").json()["arrivals"] - before["arrivals"] == 8

    def taken() -> int:  # the front ends report their counts every second
        after = httpx.get(f"{url}/v1/stats").json()["frontends"]
        return sum(f["requests"] for f in after) - sum(f["requests"] for f in before["frontends"])

    wait_for(lambda: taken() == 8, 10, "the front ends' reports")


def test_refusals_are_those_of_one_process(worker):
    _, url = worker
    nan = [[[math.nan] * 32] * 32] * 3
    json_body = {"content-type": "application/json"}
    reply = httpx.post(f"{url}/v1/infer", content=json.dumps({"input": nan}), headers=json_body)
    assert (reply.status_code, reply.json()["field"]) == (422, "input")
    reply = httpx.post(f"{url}/v1/infer", content=b"\0" * 12, headers=BINARY)
    assert reply.status_code == 422 and "12288 bytes" in reply.json()["error"]
    reply = httpx.post(
        f"{url}/v1/infer", json={"input": image(0)}, headers={"X-Deadline-Ms": "nan"}
    )
    assert (reply.status_code, reply.json()["field"]) == (422, "x-deadline-ms")
    reply = httpx.post(
        f"{url}/v1/infer", content=b"{", headers={"content-type": "application/json"}
    )
    assert reply.status_code == 422 and set(reply.json()) == {"error", "field"}
    with connect(url) as sock:  # 50 MB declared, none sent: refused before it is read
        sock.sendall(head("POST", "/v1/infer", f"Content-Length: {50 << 20}"))
        assert answer(sock)[0] == 413


def test_every_other_path_reaches_the_model_process(worker):
    _, url = worker
    assert httpx.get(f"{url}/healthz").json()["status"] == "ok"
    assert httpx.get(f"{url}/readyz").json()["status"] == "ready"
    assert (
        httpx.put(f"{url}/v1/config", json={"max_batch": 8, "timeout_ms": 2000}).status_code == 401
    )
    reply = httpx.put(f"{url}/v1/config", json={"max_batch": 8, "timeout_ms": 2000}, headers=AUTH)
    assert reply.status_code == 200 and reply.json()["config"]["version"] >= 1
    httpx.post(f"{url}/v1/infer", json={"input": image(1), "deadline_ms": 1})
    wait_for(lambda: metric(url, "tidal_worker_frontend_cpu_seconds_total") > 0, 10, "a report")
    assert metric(url, "tidal_worker_frontend_requests_total") >= 1
    assert metric(url, "tidal_worker_frontends_connected") == 2


@pytest.mark.parametrize(
    ("authorization", "framing", "status", "message"),
    [
        (None, "Content-Length: 500000000", 401, "missing bearer token"),
        ("Bearer wrong", "Content-Length: 500000000", 403, "wrong bearer token"),
        (f"Bearer {TOKEN}", "Content-Length: 500000000", 413, "at most 65536 bytes"),
        (None, "Content-Length: 100", 401, "missing bearer token"),  # never sent
        ("Bearer wrong", "Transfer-Encoding: chunked", 403, "wrong bearer token"),
    ],
)
def test_a_config_write_checks_the_token_before_a_front_end_reads_the_body(
    worker, authorization, framing, status, message
):
    """As without front ends (server.http_edge): the model process's API decides, from
    the request's head alone, before a byte of the body is read or forwarded."""
    _, url = worker
    extra = [] if authorization is None else [f"Authorization: {authorization}"]
    with connect(url) as sock:
        request = head("PUT", "/v1/config", "Content-Type: application/json", framing, *extra)
        sock.sendall(request)
        got, headers, body = answer(sock)
    assert got == status and message in body["error"], body
    assert headers["connection"] == "close"
    if status == 401:
        assert headers["www-authenticate"] == "Bearer"


def test_a_killed_front_end_is_started_again_and_counted(worker):
    _, url = worker
    first, second = frontend_pids(url)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: frontend_pids(url)[0] not in (first, None), 30, "the restart")
    wait_for(lambda: httpx.get(f"{url}/readyz").status_code == 200, 60, "readiness")
    assert frontend_pids(url)[1] == second
    assert metric(url, "tidal_worker_frontend_restarts_total") == 1
    body = torch.tensor(image(2)).numpy().tobytes()
    with ThreadPoolExecutor(8) as pool:  # several connections: both front ends serve
        replies = list(pool.map(lambda _: post_fresh(url, body), range(8)))
    assert [r.status_code for r in replies] == [200] * 8


def post_fresh(url: str, body: bytes) -> httpx.Response:
    with httpx.Client(timeout=30) as client:
        return client.post(f"{url}/v1/infer", content=body, headers=BINARY)


def test_sigterm_answers_what_the_front_ends_hold_and_exits_0(worker):
    """Last in this module: it stops the module's worker."""
    process, url = worker
    config = {"max_batch": 8, "timeout_ms": 1500}
    assert httpx.put(f"{url}/v1/config", json=config, headers=AUTH).status_code == 200
    pids = frontend_pids(url)
    body = torch.tensor(image(3)).numpy().tobytes()
    with ThreadPoolExecutor(4) as pool:
        pending = [pool.submit(post_fresh, url, body) for _ in range(4)]
        time.sleep(0.5)  # real processes: the four are queued behind the 1.5 s timeout
        process.send_signal(signal.SIGTERM)
        replies = [p.result() for p in pending]
    assert [r.status_code for r in replies] == [200] * 4
    assert process.wait(timeout=60) == 0
    for pid in pids:  # gone (or a zombie until the test process's turn to reap)
        with contextlib.suppress(FileNotFoundError):
            assert "zombie" in Path(f"/proc/{pid}/status").read_text()


# -- the model process's side in this process: a FrontendPool with real front ends, whose
# hand-offs reach a `serve` the test holds --


class Held:
    """A `serve` that keeps every request until the test answers it."""

    def __init__(self) -> None:
        self.requests: list[tuple[Parsed, asyncio.Future[Answer]]] = []

    async def __call__(self, parsed: Parsed, ingress_s: float) -> Answer:
        answered = asyncio.get_running_loop().create_future()
        self.requests.append((parsed, answered))
        return await answered

    def answer(self, index: int) -> None:
        self.requests[index][1].set_result(Answer(200, {"output": index}))


async def eventually(condition, timeout_s: float, what: str):
    """Poll `condition` (real processes, real time) until it is truthy."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if value := condition():
            return value
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


async def start_pool(serve, count: int = 1, **kwargs) -> tuple[FrontendPool, str]:
    listening = ports.listen("127.0.0.1", 0)
    listening.set_inheritable(True)
    listening.listen()  # connections wait in the backlog until uvicorn's accept begins
    pool = FrontendPool(
        count, "demo-cnn", load_codec("demo-cnn"), listening, EdgeLimits(), 10.0, **kwargs
    )
    await pool.start(serve, BackgroundErrors())
    await eventually(lambda: pool.ready, 60, "the front ends to connect")
    return pool, f"http://127.0.0.1:{listening.getsockname()[1]}"


def test_stop_closes_every_hand_off_connection():
    """A hand-off connection still open when the front ends have gone (one whose process
    did not exit, played by this test) is closed by `stop`, not left to the process."""

    async def scenario():
        pool, _ = await start_pool(Held())
        reader, writer = await asyncio.open_unix_connection(pool.handoff_path)
        writer.write(handoff.encode_hello(0))
        await writer.drain()
        await pool.stop()
        try:
            return await asyncio.wait_for(reader.read(), 10)  # to EOF
        finally:
            writer.close()

    asyncio.run(scenario())  # raises TimeoutError while the connection stays open


async def post_binary(client: httpx.AsyncClient, url: str, i: int) -> httpx.Response:
    body = torch.tensor(image(i)).numpy().tobytes()
    return await client.post(f"{url}/v1/infer", content=body, headers=BINARY)


def in_a_slot(arena: handoff.SlotArena, item: torch.Tensor) -> bool:
    """Whether `item` is read in place from one of the arena's slots (else inline)."""
    shape = tuple(item.shape)
    return any(
        arena.view(slot, item.dtype, shape).data_ptr() == item.data_ptr()
        for slot in range(arena.slots)
    )


def test_a_restarted_front_end_leaves_the_slots_of_queued_requests_alone():
    """A front end killed with a request queued: its restart shares the arena, and must
    not write into that request's slot until the model process is done with it (it
    would change the input of a batch still to run), then gets the slot back. Two
    slots, so that every slot's fate shows."""

    async def scenario():
        held = Held()
        pool, url = await start_pool(held, slots_per_frontend=2)
        arena = pool._frontends[0].arena
        async with httpx.AsyncClient(timeout=30) as client:
            lost = asyncio.create_task(post_binary(client, url, 0))
            await eventually(lambda: len(held.requests) == 1, 30, "the first hand-off")
            first = pool.summary()[0]["pid"]
            os.kill(first, signal.SIGKILL)
            with contextlib.suppress(httpx.HTTPError):  # its client went with it
                await lost
            await eventually(
                lambda: pool.ready and pool.summary()[0]["pid"] != first, 60, "the restart"
            )
            sending = []
            for i in (1, 2):  # one at a time, so each takes the first free slot
                sending.append(asyncio.create_task(post_binary(client, url, i)))
                await eventually(lambda n=i + 1: len(held.requests) == n, 30, f"request {i}")
            items = [parsed.item for parsed, _ in held.requests]
            seen = {
                "intact": [
                    torch.equal(item, torch.tensor(image(i))) for i, item in enumerate(items)
                ],
                "in a slot": [in_a_slot(arena, item) for item in items],
            }
            for i in range(3):  # the lost request's batch runs: its slot is free again
                held.answer(i)
            seen["answered"] = [(await s).status_code for s in sending]
            for i in (3, 4):
                sending.append(asyncio.create_task(post_binary(client, url, i)))
                await eventually(lambda n=i + 1: len(held.requests) == n, 30, f"request {i}")
            seen["after"] = [in_a_slot(arena, parsed.item) for parsed, _ in held.requests[3:]]
            for i in (3, 4):
                held.answer(i)
            await asyncio.gather(*sending)
        await pool.stop()
        return seen

    seen = asyncio.run(scenario())
    assert seen["intact"] == [True, True, True], "a queued request's input was overwritten"
    assert seen["in a slot"] == [True, True, False]  # both slots held: the third inline
    assert seen["answered"] == [200, 200]
    assert seen["after"] == [True, True]  # both slots handed out again


def test_a_front_end_that_keeps_exiting_is_started_again_ever_later(caplog):
    """Killed as soon as it is up, three times: started again after 1, 2 and 4 s (the
    backoff doubles; never sooner), each exit logged with its wait and counted."""

    async def scenario():
        pool, _ = await start_pool(Held())
        loop = asyncio.get_running_loop()
        waited = []
        for _ in range(3):
            pid = pool.summary()[0]["pid"]
            os.kill(pid, signal.SIGKILL)
            killed_at = loop.time()
            await eventually(
                lambda pid=pid: pool.ready and pool.summary()[0]["pid"] != pid, 60, "the restart"
            )
            waited.append(loop.time() - killed_at)
        summary = pool.summary()[0]
        await pool.stop()
        return waited, summary

    with caplog.at_level(logging.INFO, logger="tidal.worker"):
        waited, summary = asyncio.run(scenario())
    said = [r.getMessage() for r in caplog.records if "exited with code -9" in r.getMessage()]
    assert [re.search(r"again in (\S+) s", line)[1] for line in said] == ["1", "2", "4"], said
    assert waited[1] >= 2 and waited[2] >= 4, waited  # lower bounds: never sooner
    assert summary["restarts"] == 3 and summary["exits_in_a_row"] == 3


def test_the_restart_backoff_doubles_to_its_cap_and_a_stable_run_ends_the_row():
    backoff = RestartBackoff(first_s=1.0, max_s=30.0, stable_after_s=60.0)
    assert [backoff.delay_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert backoff.exits_in_a_row(5, ran_s=59.0) == 6
    assert backoff.exits_in_a_row(5, ran_s=60.0) == 1  # it ran a minute: 1 s again
    with pytest.raises(InvalidInput, match="max_s must be >= first_s"):
        RestartBackoff(first_s=2.0, max_s=1.0)
