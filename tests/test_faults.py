"""Faults under load, with real processes: nothing is lost.

Redis, a controller (static policy, batch 2) and two workers serving a model that sleeps
40 ms a batch (tests/fixtures/slow_model.py: a worker's capacity is exactly 50 req/s and
costs no CPU), under bounded open-loop load from `tidal loadgen`'s client, one stream
per worker (a balancer that pins clients). One pool takes the faults in this order:

- overload at 4x one worker's capacity for 5 s: it sheds (429) promptly at its default
  queue bound (from `--slo`), /healthz and /metrics answer within 1 s throughout, and
  afterwards its queue is empty and its RSS back within 24 MiB of before;
- Redis restarted empty under load: no request fails; the workers re-register and the
  controller, ready again, sees both and has written its config back;
- kill -9 of one worker under load: every request sent to the other is answered 200,
  and the controller's pool shows one worker within 8 s (a heartbeat lives 3 s).

The assertions are counts (statuses, workers) with time bounds many times what the
faults take here, so a busy machine slows them without failing them.
benchmarks/faults.py runs the same faults longer, with SIGTERM, Redis down for 5 s and a
leader killed, and reports what each lost.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
from processes import stop, wait_for
from redis_server import RedisProcess, free_port

from server.tools.loadgen import RequestResult, replay

POOL = "faults"
MODEL = "tests.fixtures.slow_model:build"
BATCH_S = 0.04  # the model's, per batch
MAX_BATCH = 2
CAPACITY_RPS = MAX_BATCH / BATCH_S  # one worker's: 50 req/s
RATE_RPS = 15.0  # per worker while a fault strikes: 30% of capacity
BODY = b'{"input": [1.0, 2.0, 3.0, 4.0]}'
MIB = 1024 * 1024


@dataclass
class Pool:
    redis: RedisProcess
    api: str
    workers: dict[str, str]  # name -> base URL
    processes: dict[str, subprocess.Popen]

    def summary(self) -> dict:
        return httpx.get(f"{self.api}/v1/pools/{POOL}", timeout=2).json()

    def stats(self, worker: str) -> dict:
        return httpx.get(f"{self.workers[worker]}/v1/stats", timeout=2).json()

    def whole(self) -> bool:
        """Both workers alive and ready in the controller's eyes, running its config."""
        summary = self.summary()
        return (
            summary["workers_alive"] == 2
            and summary["workers_ready"] == 2
            and all(self.stats(w)["config"]["max_batch"] == MAX_BATCH for w in self.workers)
        )


def tidal(*argv: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "server.cli", *argv],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    folder = tmp_path_factory.mktemp("faults")
    server = RedisProcess()
    server.start()
    api_port = free_port()
    processes = {
        "controller": tidal(
            "controller", "--redis", server.url, "--pool", POOL, "--workers", "2",
            "--policy", f"static:max_batch={MAX_BATCH},timeout=2ms", "--tick", "0.5s",
            "--port", str(api_port), log=folder / "controller",
        )
    }  # fmt: skip
    workers = {}
    for name in ("w0", "w1"):
        port = free_port()
        processes[name] = tidal(
            "worker", "--model", MODEL, "--redis", server.url, "--pool", POOL,
            "--name", name, "--port", str(port), "--config", "max_batch=1,timeout=0ms",
            log=folder / name,
        )  # fmt: skip
        workers[name] = f"http://127.0.0.1:{port}"
    fleet = Pool(server, f"http://127.0.0.1:{api_port}", workers, processes)
    try:
        wait_for(fleet.whole, 90, "both workers in the pool, ready, on the controller's config")
        yield fleet
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            stop(process)
        server.stop()


class Load(threading.Thread):
    """`tidal loadgen`'s open-loop client: one stream per target at `rate_rps` (evenly
    spaced, so counts are exact) for `seconds`, on its own thread."""

    def __init__(self, targets: dict[str, str], rate_rps: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.targets = targets
        self.times = np.arange(0.0, seconds, 1.0 / rate_rps)
        self.results: dict[str, list[RequestResult]] = {}
        self.started_at = 0.0

    def start(self) -> None:
        self.started_at = time.monotonic()
        super().start()

    def run(self) -> None:
        self.results = asyncio.run(self._streams())

    async def _streams(self) -> dict[str, list[RequestResult]]:
        sent = await asyncio.gather(
            *(
                replay(url, self.times, [BODY], 256, "application/json")
                for url in self.targets.values()
            )
        )
        return dict(zip(self.targets, sent, strict=True))

    def at(self, offset_s: float) -> None:
        """Sleep until `offset_s` into the load."""
        time.sleep(max(0.0, self.started_at + offset_s - time.monotonic()))

    def statuses(self, target: str) -> collections.Counter[int]:
        return collections.Counter(r.status for r in self.results[target])


class Probe(threading.Thread):
    """GETs each path every 0.2 s with a 1 s timeout; records (path, status, seconds),
    status -1 for no answer in time."""

    def __init__(self, url: str, paths: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.url, self.paths = url, paths
        self.answers: list[tuple[str, int, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=1.0) as client:
            while not self.halt.wait(0.2):
                for path in self.paths:
                    started = time.monotonic()
                    try:
                        status = client.get(f"{self.url}{path}").status_code
                    except httpx.HTTPError:
                        status = -1
                    self.answers.append((path, status, time.monotonic() - started))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def overload(url: str, seconds: float) -> Load:
    load = Load({"w0": url}, 4 * CAPACITY_RPS, seconds)
    load.start()
    load.join(seconds + 60)
    return load


def test_overload_at_4x_sheds_promptly_stays_responsive_and_gives_memory_back(pool):
    url, pid = pool.workers["w0"], pool.processes["w0"].pid
    wait_for(pool.whole, 30, "the pool whole")
    overload(url, 1.0)  # the shedding path's first allocations, before the baseline
    wait_for(lambda: pool.stats("w0")["queue_depth"] == 0, 10, "the queue to empty")
    before = rss_bytes(pid)
    probe = Probe(url, ("/healthz", "/metrics"))
    probe.start()
    load = overload(url, 5.0)
    probe.halt.set()
    probe.join(5)
    wait_for(lambda: pool.stats("w0")["queue_depth"] == 0, 5, "the queue to empty")
    time.sleep(1.0)
    after = rss_bytes(pid)

    # The test's client keeps at most 256 requests in flight, as a real client's pool
    # does; status 0 is one it held back at that bound. That happens when the client
    # itself is starved (httpx costs it about 3 ms of CPU a request: beside two CPU hogs
    # it held back 330 of 1,000), so the worker is judged on what it was sent.
    sent = [r for r in load.results["w0"] if r.status != 0]
    statuses = load.statuses("w0")
    held_back = statuses.pop(0, 0)
    assert held_back < 0.5 * len(load.times), statuses  # the overload did reach the worker
    assert set(statuses) <= {200, 429}, statuses  # nothing failed: answered or shed
    assert statuses[429] >= 0.5 * len(sent), statuses  # 4x capacity: about 3/4 shed
    assert statuses[200] >= 0.5 * CAPACITY_RPS * 5.0, statuses  # goodput near capacity
    first_shed_s = min(r.sent_s for r in sent if r.status == 429)
    assert first_shed_s < 1.0  # promptly (an unbounded queue never sheds)
    served_s = np.array([r.latency_s for r in sent if r.status == 200])
    # Admitted requests wait about the SLO (100 ms); an unbounded queue at 4x for 5 s
    # would make most wait seconds.
    assert np.quantile(served_s, 0.9) < 1.0, np.quantile(served_s, [0.5, 0.9, 0.99])
    by_path = collections.Counter(path for path, _, _ in probe.answers)
    assert by_path["/healthz"] >= 10 and by_path["/metrics"] >= 10, by_path
    slow = [(p, s, round(t, 3)) for p, s, t in probe.answers if s != 200 or t >= 1.0]
    assert slow == []
    assert after - before < 24 * MIB, (before / MIB, after / MIB)


def test_redis_restarted_empty_under_load_loses_no_request_and_the_pool_recovers(pool):
    wait_for(pool.whole, 30, "the pool whole")
    version = pool.summary()["version"]
    load = Load(pool.workers, RATE_RPS, 10.0)
    load.start()
    load.at(2.0)
    pool.redis.stop()  # no persistence: it comes back empty
    wait_for(
        lambda: httpx.get(f"{pool.api}/readyz", timeout=1).status_code == 503,
        5,
        "the controller to see Redis gone",
    )
    load.at(5.0)
    pool.redis.start()  # on the same port
    wait_for(
        lambda: httpx.get(f"{pool.api}/readyz", timeout=1).status_code == 200,
        15,
        "the controller back",
    )
    wait_for(pool.whole, 15, "both workers registered again, ready")
    stored = redis.Redis.from_url(pool.redis.url, decode_responses=True)
    restored = wait_for(lambda: stored.hget(f"tidal:{POOL}:config", "version"), 10, "config")
    load.join(60)

    for worker in pool.workers:
        assert load.statuses(worker) == {200: len(load.times)}, worker
    assert int(restored) >= version  # the controller wrote its config back, not older


def test_a_worker_killed_under_load_loses_nothing_on_the_other(pool):
    wait_for(pool.whole, 30, "the pool whole")
    load = Load(pool.workers, RATE_RPS, 8.0)
    load.start()
    load.at(2.0)
    pool.processes["w1"].kill()  # SIGKILL: no drain, no leave; its heartbeat expires
    killed_at = time.monotonic()
    wait_for(lambda: pool.summary()["workers_alive"] == 1, 8, "the controller to see w1 gone")
    detected_s = time.monotonic() - killed_at
    workers = httpx.get(f"{pool.api}/v1/pools/{POOL}/workers", timeout=2).json()["workers"]
    load.join(60)

    assert load.statuses("w0") == {200: len(load.times)}  # the survivor lost nothing
    victim = load.statuses("w1")
    assert victim[200] >= 20 and victim[-1] >= 1, victim  # killed under load, for real
    assert [w["name"] for w in workers] == ["w0"]
    assert detected_s < 8.0
