"""The whole loop with real processes: Redis, two controllers, two workers, a load generator.

One scenario on one timeline (L = when the replay starts; load steps from 5 to 40 req/s
at L+20 s, and the step is declared through the API):

    L+2   an operator pins a config for 2 s; workers run it; it expires
    L+20  the step: the controller must have warmed the larger buckets before it
    L+21  Redis stops for 2 s: no request fails; the loop recovers when it returns
    L+26  the leader is killed: the standby takes over, no config version goes back

The shell logic (leadership, versions, warm-up, fail-static) is tested in virtual time
elsewhere; this is the proof that the real processes do it together.

The controller plans with the latency model `linear:100,1` (2 workers, SLO 300 ms), under
which 5 req/s (and its noise) is served with batch 2 or 4. The operator declares the step
as 20x (100 req/s, which needs batch 16) while the replay steps to 40 req/s, so the CPU
under test is not overrun: warming 16 before the step can only come from the forecast.
The planner looks 10 s ahead (`lead=10s`), so before L+10 it has no reason to grow.
Redis runs without persistence here, so the decision log is read before it stops.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
from processes import wait_for
from prometheus_client.parser import text_string_to_metric_families
from redis_server import RedisProcess, free_port

POOL = "e2e"
TOKEN = "e2e-secret"
STEP_AT_S = 20.0
REPLAY_S = 30
LEASE_S = 1.0


def tidal(*argv: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "server.cli", *argv],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def write_trace(path: Path) -> None:
    lines = ["timestamp,count"]
    for second in range(REPLAY_S):
        count = 5 if second < STEP_AT_S else 40
        lines.append(f"2026-12-01T00:{second // 60:02d}:{second % 60:02d},{count}")
    path.write_text("\n".join(lines) + "\n")


class Watch(threading.Thread):
    """Polls the stored config version and each worker's state every 50 ms."""

    def __init__(self, redis_url: str, workers: list[str]) -> None:
        super().__init__(daemon=True)
        self.client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=0.2)
        self.workers = workers
        self.versions: list[int] = []
        self.samples: list[tuple[float, str, dict]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=1.0) as http:
            while not self.stop.is_set():
                try:
                    version = self.client.hget(f"tidal:{POOL}:config", "version")
                    if version is not None:
                        self.versions.append(int(version))
                except redis.RedisError:
                    pass  # Redis is stopped on purpose for a while
                for url in self.workers:
                    with contextlib.suppress(httpx.HTTPError):
                        self.samples.append((time.time(), url, http.get(f"{url}/v1/stats").json()))
                time.sleep(0.05)


@pytest.fixture
def fleet(tmp_path):
    server = RedisProcess()
    server.start()
    (tmp_path / "token").write_text(TOKEN)
    api = {name: free_port() for name in ("a", "b")}
    workers = [free_port(), free_port()]
    controller_args = [
        "controller", "--redis", server.url, "--pool", POOL,
        "--policy", "predictive:step=2s,lead=10s", "--workers", "2",
        "--latency-model", "linear:100,1",
        "--slo", "300ms", "--warmup", "3s", "--tick", "0.5s", "--lease", f"{LEASE_S}s",
        "--token-file", str(tmp_path / "token"),
    ]  # fmt: skip
    processes = {
        name: tidal(*controller_args, "--name", name, "--port", str(port), log=tmp_path / name)
        for name, port in api.items()
    }
    for i, port in enumerate(workers):
        processes[f"w{i}"] = tidal(
            "worker", "--model", "demo-cnn", "--redis", server.url, "--pool", POOL,
            "--port", str(port), "--name", f"w{i}", "--config", "max_batch=2,timeout=5ms",
            log=tmp_path / f"w{i}",
        )  # fmt: skip
    try:
        yield (
            server,
            {k: f"http://127.0.0.1:{p}" for k, p in api.items()},
            [f"http://127.0.0.1:{p}" for p in workers],
            processes,
            tmp_path,
        )
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes.values():
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        server.stop()


def pool(api: str) -> dict:
    return httpx.get(f"{api}/v1/pools/{POOL}", timeout=2).json()


def test_the_control_plane_end_to_end(fleet):
    server, api, workers, processes, tmp = fleet
    auth = {"authorization": f"Bearer {TOKEN}"}
    for url in api.values():
        wait_for(lambda u=url: httpx.get(f"{u}/readyz").status_code == 200, 60, f"{url} ready")
    # Whichever won the lease leads (a), the other stands by (b).
    first, second = ("a", "b") if pool(api["a"])["this_controller"]["leading"] else ("b", "a")
    a, b = api[first], api[second]
    wait_for(lambda: pool(a)["workers_alive"] == 2, 60, "both workers in the pool")
    assert pool(a)["this_controller"]["leading"] and not pool(b)["this_controller"]["leading"]
    standby_write = httpx.delete(f"{b}/v1/pools/{POOL}/override", headers=auth)
    assert standby_write.status_code == 409

    # Bad writes are refused and name what is wrong.
    pin = {"max_batch": 3, "timeout_ms": 4, "duration": "2s", "reason": "e2e"}
    assert httpx.put(f"{a}/v1/pools/{POOL}/override", json=pin).status_code == 401
    wrong = {"authorization": "Bearer nope"}
    assert httpx.put(f"{a}/v1/pools/{POOL}/override", json=pin, headers=wrong).status_code == 403
    bad = httpx.put(f"{a}/v1/pools/{POOL}/override", json={**pin, "max_batch": -1}, headers=auth)
    assert bad.status_code == 422 and bad.json()["field"] == "max_batch"
    bad = httpx.put(f"{a}/v1/pools/{POOL}/policy", json={"policy": "warp:x=1"}, headers=auth)
    assert bad.status_code == 422 and "unknown policy" in bad.json()["error"]
    bad = httpx.post(f"{a}/v1/pools/{POOL}/events", json={"events": [{"name": "x"}]}, headers=auth)
    assert bad.status_code == 422 and "start" in bad.json()["error"]

    # The replay, and the step in load declared through the API.
    trace = tmp / "trace.csv"
    write_trace(trace)
    start_at = time.time() + 3.0
    step = {"name": "step", "start": start_at + STEP_AT_S, "end": start_at + 200, "multiplier": 20}
    declared = httpx.post(f"{a}/v1/pools/{POOL}/events", json={"events": [step]}, headers=auth)
    assert declared.status_code == 200, declared.text
    watch = Watch(server.url, workers)
    watch.start()
    loadgen = subprocess.Popen(
        [
            sys.executable, "-m", "server.cli", "loadgen", "--trace", str(trace),
            "--target", ",".join(workers), "--start-at", repr(start_at), "--json",
            "--out", str(tmp / "requests.csv"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip

    def at(offset_s: float) -> None:
        time.sleep(max(0.0, start_at + offset_s - time.time()))

    # An override pins the config, then expires.
    at(2)
    pinned = httpx.put(f"{a}/v1/pools/{POOL}/override", json=pin, headers=auth)
    assert pinned.status_code == 200, pinned.text
    wait_for(
        lambda: all(httpx.get(f"{w}/v1/stats").json()["config"]["max_batch"] == 3 for w in workers),
        3,
        "workers running the pinned config",
    )
    assert pool(a)["mode"] == "override"
    wait_for(lambda: pool(a)["override"] is None, 6, "the override to expire")

    # Redis goes away and comes back.
    at(STEP_AT_S + 0.5)
    records = httpx.get(f"{a}/v1/pools/{POOL}/decisions", params={"limit": 1000}).json()
    at(STEP_AT_S + 1)
    server.stop()
    wait_for(lambda: httpx.get(f"{a}/readyz").status_code == 503, 5, "a to report not ready")
    time.sleep(2)
    server.start()
    wait_for(lambda: httpx.get(f"{a}/readyz").status_code == 200, 15, "a to recover")
    wait_for(lambda: pool(a)["workers_alive"] == 2, 10, "workers to rejoin")

    # The leader dies; the standby takes over within two leases (plus a tick).
    at(STEP_AT_S + 6)  # Redis was back within 3.5 s in every run seen here
    metrics_a = httpx.get(f"{a}/metrics").text
    processes[first].kill()
    killed = time.monotonic()
    wait_for(lambda: pool(b)["this_controller"]["leading"], 2 * LEASE_S + 2, "b to lead")
    takeover_s = time.monotonic() - killed

    summary = json.loads(loadgen.communicate(timeout=120)[0].strip().splitlines()[-1])
    watch.stop.set()
    watch.join()

    # No request failed, through the override, the Redis outage and the failover.
    assert summary["by_status"] == {"200": summary["requests"]}
    assert summary["requests"] > 0.9 * (5 * STEP_AT_S + 40 * (REPLAY_S - STEP_AT_S))

    # The pool ran small batches, then warmed the step's sizes before the step, and
    # the decision log says why.
    step_s = start_at + STEP_AT_S
    seen = [(t - start_at, url, s["config"], s["warmed_buckets"]) for t, url, s in watch.samples]
    (tmp / "timeline.json").write_text(json.dumps({"decisions": records, "workers": seen}))
    warm = {url: [] for url in workers}
    for t, url, stats in watch.samples:
        warm[url].append((t, 16 in stats["warmed_buckets"]))
    for url, seen in warm.items():
        assert not any(w for t, w in seen if start_at + 6 < t < step_s - 11), url
        assert all(w for t, w in seen if step_s - 1 < t < step_s), url
    ahead = [
        r
        for r in records["decisions"]
        if start_at + 6 < r["time"] < step_s and r["chosen"]["warm_max_batch"] >= 16
    ]
    assert ahead, "no decision warmed batch 16 before the step"
    assert "forecast upper bound" in ahead[0]["reason"], ahead[0]["reason"]

    # Config versions never went backwards, across the outage and the failover.
    assert watch.versions == sorted(watch.versions)
    assert takeover_s < 2 * LEASE_S + 1.5

    # Every process's /metrics parses.
    for text in [metrics_a, *(httpx.get(f"{u}/metrics").text for u in [b, *workers])]:
        families = {f.name for f in text_string_to_metric_families(text)}
        assert families
    assert "tidal_controller_decisions" in {
        f.name for f in text_string_to_metric_families(metrics_a)
    }
