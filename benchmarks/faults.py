"""Faults under load: what each costs in requests, and how long the pool takes to see it.

Each fault strikes a fresh pool of real processes: a private redis-server (no disk),
a controller (two for the leader's fault; `static:max_batch=8,timeout=5ms`, default tick
and lease) and two `tidal worker --model demo-cnn` in the pool (the default queue bound,
from `--slo`), under open-loop Poisson load from an httpx client in this process (as
`tidal loadgen`'s), one stream per worker at `--rate` req/s (a balancer that pins its
clients), for `--seconds`, the fault at `--fault-at`:

- kill -9 of worker w1: requests lost on w0, those in flight on w1; until the controller
  counts one worker alive;
- SIGTERM of w1: the same, and whether w1 answered all it held before it exited;
- Redis restarted empty (stop, start on the same port at once) and Redis down for 5 s:
  requests lost; until the controller says not ready, then ready again once Redis is
  back, and sees both workers again;
- the leading controller killed -9: requests lost; until the standby leads; the config
  versions in Redis before and after, polled every 50 ms (never backwards?);
- overload: one worker serving a model that sleeps 40 ms a batch at batch 2 (capacity
  50 req/s, no CPU: tests/fixtures/slow_model.py, so this client can offer 4x on two
  shared cores) at 4x its capacity for `--overload-seconds`, its queue at the default
  bound from `--slo`: served and shed, the first shed, /healthz and /metrics probed every
  0.2 s, its RSS before, at most during, and after.

A failed request is one not answered 200. Failures are split: shed (429, answered at
once with Retry-After: the queue bound at work, not a fault's loss); for a worker's
fault, the victim's unanswered requests sent before the fault struck (held: in flight or
queued) and sent after it (a balancer would route them elsewhere); and every other
unanswered request (lost by a live worker: none is the claim). Each send's instant is
recorded on this process's monotonic clock, as is the fault's, so the split is exact.

    PYTHONPATH=. python benchmarks/faults.py [--rate 40] [--seconds 30] [--fault-at 10]
        [--overload-seconds 20] [--only kill9,sigterm,...]

Prints a table per fault and the overload's; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import redis

from server.tools.loadgen import encode_payloads
from server.worker.models import load_model

ROOT = Path(__file__).resolve().parents[1]
POOL = "faults"
POLICY = "static:max_batch=8,timeout=5ms"
SLOW_MODEL = "tests.fixtures.slow_model:build"
SLOW_CAPACITY_RPS = 2 / 0.04  # batch 2, 40 ms a batch
SLOW_BODY = b'{"input": [1.0, 2.0, 3.0, 4.0]}'
MIB = 1024 * 1024


def redis_process():
    """The tests' private redis-server (free port, no disk): one way to start it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from redis_server import RedisProcess

    return RedisProcess()


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports, each checked (the tests' way: one
    free port says nothing of the next)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from processes import free_ports as block

    return block(count)


def until(condition: Callable[[], Any], timeout_s: float, poll_s: float = 0.05) -> float | None:
    """Seconds until `condition()` is truthy (HTTP and Redis errors count as not yet),
    or None if it never was within `timeout_s`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        with contextlib.suppress(httpx.HTTPError, redis.RedisError, KeyError, ValueError):
            if condition():
                return round(time.monotonic() - started, 3)
        time.sleep(poll_s)
    return None


def tidal(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "server.cli", *argv],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
    )


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


class Fleet:
    """A private Redis, `controllers` controllers and two workers of one pool."""

    def __init__(self, folder: Path, controllers: int) -> None:
        self.folder = folder
        self.redis = redis_process()
        self.processes: dict[str, subprocess.Popen] = {}
        self.controllers = controllers
        self.apis: dict[str, str] = {}
        self.workers: dict[str, str] = {}

    def start(self) -> None:
        self.redis.start()  # first: its port is taken before the block is chosen
        first = free_ports(self.controllers + 2)  # the controllers' APIs, then two workers
        self.apis = {f"c{i}": f"http://127.0.0.1:{first + i}" for i in range(self.controllers)}
        workers = first + self.controllers
        self.workers = {f"w{i}": f"http://127.0.0.1:{workers + i}" for i in range(2)}
        for name, url in self.apis.items():
            self._start(
                name,
                [
                    "controller",
                    "--redis",
                    self.redis.url,
                    "--pool",
                    POOL,
                    "--policy",
                    POLICY,
                    "--workers",
                    "2",
                    "--name",
                    name,
                    "--port",
                    url.rsplit(":", 1)[1],
                ],
            )
        for name, url in self.workers.items():
            self._start(
                name,
                [
                    "worker",
                    "--model",
                    "demo-cnn",
                    "--redis",
                    self.redis.url,
                    "--pool",
                    POOL,
                    "--name",
                    name,
                    "--port",
                    url.rsplit(":", 1)[1],
                ],
            )
        if until(self._up, 180) is None:
            raise RuntimeError(f"the pool did not come up; logs in {self.folder}")

    def _up(self) -> bool:
        """The pool is whole; a process that exited meanwhile (one that lost its port
        to another between the check and its bind) fails the start at once."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                log = self.folder / f"{name}.log"
                raise RuntimeError(f"{name} exited ({process.returncode}) starting; see {log}")
        return self.whole()

    def _start(self, name: str, argv: list[str]) -> None:
        self.processes[name] = tidal(argv, self.folder / f"{name}.log")

    def summary(self, controller: str) -> dict:
        return httpx.get(f"{self.apis[controller]}/v1/pools/{POOL}", timeout=1).json()

    def leader(self) -> str | None:
        for name in self.apis:
            if (
                self.processes[name].poll() is None
                and self.summary(name)["this_controller"]["leading"]
            ):
                return name
        return None

    def alive(self) -> int:
        return self.summary(self.leader())["workers_alive"]

    def whole(self) -> bool:
        leader = self.leader()
        if leader is None:
            return False
        summary = self.summary(leader)
        return summary["workers_alive"] == 2 and summary["workers_ready"] == 2

    def ready(self, controller: str) -> bool:
        return httpx.get(f"{self.apis[controller]}/readyz", timeout=1).status_code == 200

    def version(self) -> int | None:
        client = redis.Redis.from_url(self.redis.url, socket_timeout=0.2)
        value = client.hget(f"tidal:{POOL}:config", "version")
        return None if value is None else int(value)

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.redis.stop()


@dataclass(frozen=True)
class Answer:
    sent_at: float  # monotonic, this process's clock
    status: int  # -1: no answer (refused, reset, timed out)
    latency_s: float


class Load(threading.Thread):
    """Open-loop Poisson arrivals at `rate_rps` for `seconds`, one stream per target,
    on its own thread (an httpx client per stream, as `tidal loadgen`'s); every send's
    instant is recorded on this process's monotonic clock, so a request is placed
    before or after a fault exactly. The arrivals start at `origin`, once the clients
    exist."""

    def __init__(
        self,
        targets: dict[str, str],
        rate_rps: float,
        seconds: float,
        seed: int,
        payloads: list[bytes],
        content_type: str,
    ) -> None:
        super().__init__(daemon=True)
        self.targets, self.payloads, self.content_type = targets, payloads, content_type
        rng = np.random.default_rng(seed)
        times = np.cumsum(rng.standard_exponential(int(rate_rps * seconds * 1.3) + 10) / rate_rps)
        self.times = times[times < seconds]
        self.results: dict[str, list[Answer]] = {}
        self.origin = time.monotonic() + 0.5

    def run(self) -> None:
        self.results = asyncio.run(self._streams())

    async def _streams(self) -> dict[str, list[Answer]]:
        answers = await asyncio.gather(*(self._stream(url) for url in self.targets.values()))
        return dict(zip(self.targets, answers, strict=True))

    async def _stream(self, url: str) -> list[Answer]:
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
        async with httpx.AsyncClient(timeout=60.0, limits=limits) as client:
            tasks = []
            for i, at in enumerate(self.times):
                await asyncio.sleep(max(0.0, self.origin + at - time.monotonic()))
                body = self.payloads[i % len(self.payloads)]
                tasks.append(asyncio.create_task(self._send(client, f"{url}/v1/infer", body)))
            return list(await asyncio.gather(*tasks))

    async def _send(self, client: httpx.AsyncClient, url: str, body: bytes) -> Answer:
        sent_at = time.monotonic()
        try:
            response = await client.post(
                url, content=body, headers={"content-type": self.content_type}
            )
            status = response.status_code
        except httpx.HTTPError:
            status = -1
        return Answer(sent_at, status, time.monotonic() - sent_at)

    def at(self, offset_s: float) -> None:
        """Sleep until `offset_s` into the load."""
        time.sleep(max(0.0, self.origin + offset_s - time.monotonic()))


class VersionWatch(threading.Thread):
    """The stored config version every 50 ms (Redis away: nothing recorded)."""

    def __init__(self, fleet: Fleet) -> None:
        super().__init__(daemon=True)
        self.fleet, self.versions, self.halt = fleet, [], threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.05):
            with contextlib.suppress(redis.RedisError):
                version = self.fleet.version()
                if version is not None:
                    self.versions.append(version)


# -- the faults: each strikes, then measures how long the pool takes to see it --------


def kill_worker(fleet: Fleet) -> dict:
    fleet.processes["w1"].kill()
    return {"victim": "w1", "detect_s": until(lambda: fleet.alive() == 1, 30)}


def terminate_worker(fleet: Fleet) -> dict:
    process = fleet.processes["w1"]
    process.send_signal(signal.SIGTERM)
    started = time.monotonic()
    detect_s = until(lambda: fleet.alive() == 1, 30)
    process.wait(60)
    exited_s = round(time.monotonic() - started, 3)
    return {
        "victim": "w1",
        "detect_s": detect_s,
        "exit_code": process.returncode,
        "exited_s": exited_s,
    }


def restart_redis(down_s: float) -> Callable[[Fleet], dict]:
    def fault(fleet: Fleet) -> dict:
        controller = fleet.leader()
        fleet.redis.stop()
        stopped = time.monotonic()
        detect_s = until(lambda: not fleet.ready(controller), 30)
        time.sleep(max(0.0, stopped + down_s - time.monotonic()))
        fleet.redis.start()  # the same port, empty
        back_after_s = round(time.monotonic() - stopped, 3)
        return {
            "detect_s": detect_s,
            "redis_back_after_s": back_after_s,
            "recover_s": until(lambda: fleet.ready(controller), 60),  # from Redis back
            "whole_s": until(fleet.whole, 60),  # then both workers seen again
        }

    return fault


def kill_leader(fleet: Fleet) -> dict:
    leader = fleet.leader()
    standby = next(name for name in fleet.apis if name != leader)
    version_before = fleet.version()
    fleet.processes[leader].kill()
    detect_s = until(lambda: fleet.summary(standby)["this_controller"]["leading"], 30)
    time.sleep(3.0)
    return {
        "killed": leader,
        "detect_s": detect_s,
        "version_before": version_before,
        "version_after": fleet.version(),
    }


FAULTS: dict[str, tuple[str, int, Callable[[Fleet], dict]]] = {
    "kill9": ("kill -9 of one worker", 1, kill_worker),
    "sigterm": ("SIGTERM of one worker", 1, terminate_worker),
    "redis-restart": ("Redis restarted empty", 1, restart_redis(0.0)),
    "redis-down": ("Redis down 5 s, back empty", 1, restart_redis(5.0)),
    "leader": ("the leader killed -9", 2, kill_leader),
}


def count_failures(load: Load, fault_at: float, victim: str | None) -> dict:
    """Requests sent, answered 200, shed (429: answered at once), and not answered:
    by the victim, those it held when the fault struck and those sent to it after; by
    any other worker (lost)."""
    counts = collections.Counter()
    for worker, answers in load.results.items():
        for a in answers:
            counts["sent"] += 1
            if a.status == 200:
                continue
            counts["failed"] += 1
            if a.status == 429:
                counts["shed"] += 1
            elif worker != victim:
                counts["lost_elsewhere"] += 1
            elif a.sent_at >= fault_at:
                counts["victim_sent_after"] += 1
            else:
                counts["victim_held"] += 1
    keys = ("sent", "failed", "shed", "victim_held", "victim_sent_after", "lost_elsewhere")
    statuses = {
        worker: dict(sorted(collections.Counter(str(a.status) for a in answers).items()))
        for worker, answers in load.results.items()
    }
    return {**{key: counts[key] for key in keys}, "by_status": statuses}


def run_fault(key: str, args, folder: Path, payloads, content_type) -> dict:
    title, controllers, strike = FAULTS[key]
    fleet = Fleet(folder / key, controllers)
    (folder / key).mkdir()
    try:
        fleet.start()
        watch = VersionWatch(fleet)
        watch.start()
        load = Load(fleet.workers, args.rate, args.seconds, args.seed, payloads, content_type)
        load.start()
        load.at(args.fault_at)
        fault_at = time.monotonic()
        figures = strike(fleet)
        load.join(args.seconds + 120)
        watch.halt.set()
        watch.join(2)
    finally:
        fleet.close()
    versions = watch.versions
    return {
        "fault": key,
        "title": title,
        **count_failures(load, fault_at, figures.get("victim")),
        **figures,
        "versions_monotone": versions == sorted(versions),
        "versions": [min(versions), max(versions)] if versions else None,
    }


# -- overload --------------------------------------------------------------------------


class Probe(threading.Thread):
    """GETs each path every 0.2 s with a 1 s timeout, and samples the worker's RSS."""

    def __init__(self, url: str, pid: int) -> None:
        super().__init__(daemon=True)
        self.url, self.pid = url, pid
        self.answers: list[tuple[str, int, float]] = []
        self.rss: list[int] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=1.0) as client:
            while not self.halt.wait(0.2):
                self.rss.append(rss_bytes(self.pid))
                for path in ("/healthz", "/metrics"):
                    started = time.monotonic()
                    try:
                        status = client.get(f"{self.url}{path}").status_code
                    except httpx.HTTPError:
                        status = -1
                    self.answers.append((path, status, time.monotonic() - started))


def start_slow_worker(folder: Path) -> tuple[subprocess.Popen, str]:
    url = f"http://127.0.0.1:{free_ports(1)}"
    process = tidal(
        [
            "worker",
            "--model",
            SLOW_MODEL,
            "--config",
            "max_batch=2,timeout=2ms",
            "--port",
            url.rsplit(":", 1)[1],
        ],
        folder / "overload.log",
    )

    def ready() -> bool:
        if process.poll() is not None:  # its port taken meanwhile, say: fail at once
            raise RuntimeError(f"the overloaded worker exited; see {folder / 'overload.log'}")
        return httpx.get(f"{url}/readyz", timeout=1).status_code == 200

    if until(ready, 120) is None:
        raise RuntimeError("the overloaded worker did not start")
    return process, url


def queue_empty(url: str) -> bool:
    return httpx.get(f"{url}/v1/stats", timeout=1).json()["queue_depth"] == 0


def overload_load(url: str, seconds: float, seed: int) -> Load:
    load = Load({"w": url}, 4 * SLOW_CAPACITY_RPS, seconds, seed, [SLOW_BODY], "application/json")
    load.start()
    load.join(seconds + 120)
    return load


def run_overload(args, folder: Path) -> dict:
    process, url = start_slow_worker(folder)
    try:
        overload_load(url, 2.0, args.seed + 1)  # the shedding path's first allocations
        until(lambda: queue_empty(url), 30)
        time.sleep(3.0)
        before = rss_bytes(process.pid)
        probe = Probe(url, process.pid)
        probe.start()
        load = overload_load(url, args.overload_seconds, args.seed)
        probe.halt.set()
        probe.join(5)
        empty_s = until(lambda: queue_empty(url), 30)
        time.sleep(5.0)
        after = rss_bytes(process.pid)
    finally:
        process.terminate()
        process.wait(30)
    return overload_figures(load, probe, before, after, empty_s, args)


def overload_figures(
    load: Load, probe: Probe, before: int, after: int, empty_s: float | None, args
) -> dict:
    sent = load.results["w"]
    statuses = collections.Counter(r.status for r in sent)
    served = np.array([r.latency_s for r in sent if r.status == 200]) * 1e3
    shed = [r.sent_at - load.origin for r in sent if r.status == 429]
    worst = {
        path: round(max(t for p, _, t in probe.answers if p == path) * 1e3, 1)
        for path in ("/healthz", "/metrics")
    }
    return {
        "offered_rps": 4 * SLOW_CAPACITY_RPS,
        "capacity_rps": SLOW_CAPACITY_RPS,
        "seconds": args.overload_seconds,
        "sent": len(sent),
        "served": statuses[200],
        "shed": statuses[429],
        "failed_other": len(sent) - statuses[200] - statuses[429],
        "goodput_rps": round(statuses[200] / args.overload_seconds, 1),
        "first_shed_ms": round(min(shed) * 1e3, 1) if shed else None,
        "served_p50_ms": round(float(np.quantile(served, 0.5)), 1),
        "served_p99_ms": round(float(np.quantile(served, 0.99)), 1),
        "probes": len(probe.answers),
        "probes_failed": sum(status != 200 for _, status, _ in probe.answers),
        "probe_max_ms": worst,
        "queue_empty_after_s": empty_s,
        "rss_before_mib": round(before / MIB, 1),
        "rss_max_mib": round(max(probe.rss) / MIB, 1),
        "rss_after_mib": round(after / MIB, 1),
    }


# -- report ----------------------------------------------------------------------------


def print_faults(rows: list[dict]) -> None:
    print(
        f"\n{'fault':<27} {'sent':>5} {'failed':>6} {'shed':>5} {'victim held':>11} "
        f"{'sent after':>10} {'lost':>5} {'detect s':>8} {'recover s':>9}"
    )
    for r in rows:
        recover = r.get("whole_s") if "whole_s" in r else r.get("exited_s")
        print(
            f"{r['title']:<27} {r['sent']:>5} {r['failed']:>6} {r['shed']:>5} "
            f"{r['victim_held']:>11} {r['victim_sent_after']:>10} {r['lost_elsewhere']:>5} "
            f"{r['detect_s']!s:>8} {recover!s:>9}"
        )


def print_overload(o: dict) -> None:
    print(
        f"\noverload {o['offered_rps']:.0f} req/s on capacity {o['capacity_rps']:.0f} for "
        f"{o['seconds']:g} s: sent {o['sent']}, served {o['served']} ({o['goodput_rps']} req/s), "
        f"shed {o['shed']}, other failures {o['failed_other']}; first shed at "
        f"{o['first_shed_ms']} ms; served p50 {o['served_p50_ms']} ms, p99 {o['served_p99_ms']} "
        f"ms; {o['probes']} probes, {o['probes_failed']} failed, slowest {o['probe_max_ms']}; "
        f"queue empty {o['queue_empty_after_s']} s after; RSS {o['rss_before_mib']} MiB before, "
        f"{o['rss_max_mib']} at most, {o['rss_after_mib']} after"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=40.0, help="req/s per worker, Poisson")
    parser.add_argument("--seconds", type=float, default=30.0, help="load per fault")
    parser.add_argument("--fault-at", type=float, default=10.0, help="seconds into the load")
    parser.add_argument("--overload-seconds", type=float, default=20.0)
    parser.add_argument("--only", default=",".join([*FAULTS, "overload"]))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    chosen = args.only.split(",")
    payloads, content_type = encode_payloads(load_model("demo-cnn"), "binary")
    with tempfile.TemporaryDirectory(prefix="tidal-faults-") as tmp:
        folder = Path(tmp)
        rows = [run_fault(k, args, folder, payloads, content_type) for k in FAULTS if k in chosen]
        overload = run_overload(args, folder) if "overload" in chosen else None
    print_faults(rows)
    if overload is not None:
        print_overload(overload)
    print(
        json.dumps(
            {
                "benchmark": "faults",
                "rate_rps_per_worker": args.rate,
                "seconds": args.seconds,
                "fault_at_s": args.fault_at,
                "faults": rows,
                "overload": overload,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
