"""A Ray cluster with Serve on loopback, and the probes the Ray Serve tests and benchmark
use around it: an open-loop load whose rate can change, and a listener that stamps each
config notice as Redis delivers it.

Ray is started in this process (`ray.init(address="local")`), so `ray.shutdown()` stops
exactly the processes it started; `ray stop` would stop every Ray on the machine. Every
listener Ray opens is on 127.0.0.1 except one that Ray 2.60 does not let us move: each
replica's inter-deployment gRPC server binds `[::]:0` (ray/serve/_private/replica.py,
hard-coded; Ray's token authentication, on by default, guards it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import redis
from redis_server import free_port

REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def ray_serve_cluster(num_cpus: int = 2) -> Iterator[str]:
    """A local Ray cluster and Serve's HTTP proxy on 127.0.0.1; yields the proxy's URL."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # Serve's proxy must answer its ready check in 5 s and its health checks in 10 s, or
    # the controller kills it: beside two CPU hogs on 2 cores it did not, and serve.start
    # failed with the proxy "killed by ray.kill" before it ran. Slack for a busy machine.
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
    os.environ.setdefault("RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S", "60")
    # Ray starts its worker processes (the controller, the proxy, the replicas) at nice 15
    # (worker_niceness): beside other busy processes they starve (a replica's start took
    # over 90 s beside two CPU hogs). At nice 0 they take their share, as a deployment's
    # replicas would on their own nodes.
    os.environ.setdefault("RAY_worker_niceness", "0")
    # Replicas import the example by name (examples.ray_serve_app): Ray's processes
    # inherit this environment.
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = f"{REPO}{os.pathsep}{path}" if path else str(REPO)
    import ray
    from ray import serve

    ray.init(
        address="local",
        _node_ip_address="127.0.0.1",
        include_dashboard=False,
        num_cpus=num_cpus,
        configure_logging=False,
        log_to_driver=False,
    )
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()


def demo_payloads(count: int = 16) -> tuple[list[bytes], str]:
    """The demo CNN's seeded example inputs as binary bodies."""
    from server.worker.models import load_model

    model = load_model("demo-cnn")
    return [model.to_bytes(model.example(i)) for i in range(count)], "application/octet-stream"


@dataclass(frozen=True, slots=True)
class Sent:
    """One request: when it left (Unix time), its status (-1: no answer), latency, and
    how the replica says it was served (the response's `timing`)."""

    at: float
    status: int
    latency_s: float
    timing: dict | None


class OpenLoopLoad(threading.Thread):
    """Poisson arrivals at `rate_rps` (changeable at any time; 0 pauses) to `url`, open
    loop: a slow answer never delays the next request. Results accumulate in `sent`."""

    def __init__(
        self,
        url: str,
        rate_rps: float,
        payloads: list[bytes],
        content_type: str,
        seed: int = 0,
        max_in_flight: int = 512,
        timeout_s: float = 30.0,
    ) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.rate_rps = rate_rps
        self.payloads = payloads
        self.content_type = content_type
        self.rng = np.random.default_rng(seed)
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.sent: list[Sent] = []
        self.not_sent = 0  # arrivals dropped at the in-flight bound (never queued here)
        self.in_flight = 0
        self._halt = threading.Event()

    def run(self) -> None:
        asyncio.run(self._run())

    def stop(self) -> None:
        """Stop sending; returns once every request in flight has its answer."""
        self._halt.set()
        self.join(self.timeout_s + 5)

    def between(self, start: float, end: float) -> list[Sent]:
        return [s for s in list(self.sent) if start <= s.at < end]

    def drained(self) -> bool:
        return self.in_flight == 0

    async def _run(self) -> None:
        limits = httpx.Limits(max_connections=self.max_in_flight)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as client:
            tasks: set[asyncio.Task] = set()
            count = 0
            loop = asyncio.get_running_loop()
            due_at = loop.time()
            while not self._halt.is_set():
                rate = self.rate_rps
                if rate <= 0:
                    await asyncio.sleep(0.02)
                    due_at = loop.time()
                    continue
                # Arrivals are due at fixed instants, so a busy loop that wakes late
                # sends the late ones at once rather than lowering the rate.
                due_at = max(due_at, loop.time() - 1.0) + float(self.rng.exponential(1.0 / rate))
                await asyncio.sleep(max(0.0, due_at - loop.time()))
                if self.in_flight >= self.max_in_flight:
                    self.not_sent += 1
                    continue
                body = self.payloads[count % len(self.payloads)]
                count += 1
                task = asyncio.create_task(self._send(client, body))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.wait(tasks)

    async def _send(self, client: httpx.AsyncClient, body: bytes) -> None:
        self.in_flight += 1
        at, started = time.time(), time.perf_counter()
        try:
            response = await client.post(
                self.url, content=body, headers={"content-type": self.content_type}
            )
            timing = response.json().get("timing") if response.status_code == 200 else None
            self.sent.append(Sent(at, response.status_code, time.perf_counter() - started, timing))
        except (httpx.HTTPError, ValueError):
            self.sent.append(Sent(at, -1, time.perf_counter() - started, None))
        finally:
            self.in_flight -= 1


class ConfigNotices(threading.Thread):
    """Stamps each config version with the Unix time its notice reached a subscriber on
    this machine: when it was published, as the replicas' subscriptions see it.
    Reconnects if Redis goes away."""

    def __init__(self, redis_url: str, pool: str, prefix: str = "tidal") -> None:
        super().__init__(daemon=True)
        self.redis_url = redis_url
        self.channel = f"{prefix}:{pool}:config:notify"
        self.published_at: dict[int, float] = {}
        self._halt = threading.Event()
        self.subscribed = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self._listen()
            except (redis.RedisError, OSError):
                time.sleep(0.1)

    def _listen(self) -> None:
        client = redis.Redis.from_url(self.redis_url, decode_responses=True, socket_timeout=1)
        with contextlib.closing(client), client.pubsub() as pubsub:
            pubsub.subscribe(self.channel)
            self.subscribed.set()
            while not self._halt.is_set():
                message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.2)
                if message is not None and message["type"] == "message":
                    self.published_at.setdefault(int(message["data"]), time.time())
