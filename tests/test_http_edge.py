"""The edge of the worker's and the controller's APIs, over raw sockets to real processes:
bodies past their bound are refused before they are read, a write's token is checked
before its body, and slow clients are cut off (server.http_edge).

A raw socket, not httpx: these clients lie about what they will send (a Content-Length of
500 MB with nothing behind it, one byte and then silence), which is the point.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from processes import start_controller, stop, wait_for
from test_worker_http import free_port, start_worker

TOKEN = "s3cret-token"  # start_worker's
BOUND = 100_000


@pytest.fixture(scope="module")
def worker():
    process, url = start_worker(
        "--config", "max_batch=4,timeout=5ms", "--max-body-bytes", str(BOUND),
        "--client-timeout", "1s",
    )  # fmt: skip
    yield url
    process.terminate()
    process.wait(timeout=30)


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    return sock


def answer(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """Read one response (its Content-Length body) off the socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    while len(body) < int(headers["content-length"]):
        body += sock.recv(65536)
    return int(status_line.split()[1]), headers, json.loads(body)


def head(method: str, path: str, *extra: str) -> bytes:
    return "\r\n".join([f"{method} {path} HTTP/1.1", "Host: test", *extra, "", ""]).encode()


def closed_within(sock: socket.socket, seconds: float) -> float:
    """Seconds until the server closed the connection (raises if it did not in time)."""
    sock.settimeout(seconds)
    start = time.monotonic()
    while sock.recv(65536):
        pass
    return time.monotonic() - start


def test_a_body_declared_past_the_bound_is_413_before_a_byte_of_it_is_sent(worker):
    with connect(worker) as sock:
        start = time.monotonic()
        sock.sendall(
            head("POST", "/v1/infer", "Content-Type: application/json", "Content-Length: 500000000")
        )
        status, headers, body = answer(sock)
        assert status == 413 and time.monotonic() - start < 5
        assert body["field"] == "content-length"
        assert f"at most {BOUND} bytes" in body["error"] and "500000000 bytes" in body["error"]
        assert headers["connection"] == "close"
    # Every other endpoint takes a small JSON document only.
    with connect(worker) as sock:
        sock.sendall(
            head("PUT", "/v1/config", f"Authorization: Bearer {TOKEN}", "Content-Length: 1000000")
        )
        assert answer(sock)[0] == 413


def test_a_chunked_body_is_cut_off_once_it_passes_the_bound(worker):
    with connect(worker) as sock:
        sock.sendall(head("POST", "/v1/infer", "Transfer-Encoding: chunked"))
        chunk = b"x" * 30_000
        sent = 0
        with pytest.raises(OSError):  # the server stops reading and closes
            for _ in range(1000):
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        assert sent < 50 * BOUND
    with connect(worker) as sock:  # and it is still serving
        sock.sendall(head("POST", "/v1/infer", "Transfer-Encoding: chunked"))
        for _ in range(4):
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, _, body = answer(sock)
        assert status == 413 and "more than 100000 bytes sent" in body["error"]


def test_a_body_that_stops_arriving_gets_408_and_a_silent_head_is_closed(worker):
    with connect(worker) as sock:
        sock.sendall(
            head("POST", "/v1/infer", "Content-Type: application/json", "Content-Length: 500")
        )
        sock.sendall(b'{"input": [')
        start = time.monotonic()
        status, _, body = answer(sock)
        assert status == 408 and 0.5 < time.monotonic() - start < 5
        assert "within 1 s (11 bytes read)" in body["error"]
    with connect(worker) as sock:  # one byte of a request head, then nothing
        sock.sendall(b"P")
        assert closed_within(sock, 5) < 5
    with connect(worker) as sock:  # connected, never a byte
        assert closed_within(sock, 5) < 5
    assert httpx.get(f"{worker}/healthz").status_code == 200


def test_a_request_within_the_bounds_is_served_as_before(worker):
    image = [[[0.5] * 32] * 32] * 3
    reply = httpx.post(f"{worker}/v1/infer", json={"input": image})
    assert reply.status_code == 200 and len(reply.json()["output"]) == 10


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    folder = tmp_path_factory.mktemp("edge")
    (folder / "token").write_text(TOKEN)
    port = free_port()
    process = start_controller(
        [
            "--redis", "none", "--pool", "edge", "--policy", "static:max_batch=8,timeout=10ms",
            "--token-file", str(folder / "token"), "--port", str(port),
        ],
        folder / "controller.log",
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(f"{url}/healthz").status_code == 200, 60, "the controller")
        yield url
    finally:
        stop(process)


@pytest.mark.parametrize(
    ("authorization", "status", "message"),
    [
        (None, 401, "missing bearer token"),
        ("Bearer wrong", 403, "wrong bearer token"),
        (f"Bearer {TOKEN}", 413, "at most 1048576 bytes"),
    ],
)
def test_a_controller_write_checks_the_token_before_it_reads_the_body(
    controller, authorization, status, message
):
    """The probe before this: an unauthenticated 500 MB body froze the controller for 42 s
    before its 401. Now nothing of the body is sent and the answer comes at once."""
    extra = [] if authorization is None else [f"Authorization: {authorization}"]
    with connect(controller) as sock:
        start = time.monotonic()
        request = head(
            "POST", "/v1/pools/edge/events", "Content-Type: application/json",
            "Content-Length: 500000000", *extra,
        )  # fmt: skip
        sock.sendall(request)
        got, headers, body = answer(sock)
        assert (got, time.monotonic() - start < 5) == (status, True)
        assert message in body["error"]
        if status == 401:
            assert headers["www-authenticate"] == "Bearer"
    assert httpx.get(f"{controller}/healthz").status_code == 200
