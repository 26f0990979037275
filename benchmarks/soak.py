"""Soak: one worker at a steady load for minutes, its resident memory sampled throughout.

A real `tidal worker --model demo-cnn` (CPU; standalone, or with `--pooled` in a pool on
a private redis-server, no controller, its link reporting every second) takes open-loop
Poisson load at `--rate` req/s (binary bodies, `tidal loadgen`'s client in this process)
for `--minutes`; the worker's RSS is read from /proc every `--every` seconds. Reported:
RSS at the first sample (the worker warm, the load just begun), at the end, its maximum,
and its slope (least squares, MiB per hour) over the whole run and over its second half,
where a leak shows and start-up growth does not; requests sent and failed; latency.

    PYTHONPATH=. python benchmarks/soak.py [--minutes 10] [--rate 50] [--every 10] [--pooled]

Prints a table of the samples and the figures; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from server.tools.loadgen import encode_payloads, replay, summarise
from server.worker.models import load_model

MIB = 1024 * 1024


ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A free port, the tests' way (tests/processes.py); a worker that loses it to another
    process between this check and its bind exits, which `start_worker` sees at once."""
    sys.path.insert(0, str(ROOT / "tests"))
    from processes import free_ports

    return free_ports(1)


def start_worker(*args: str) -> tuple[subprocess.Popen, str]:
    """A `tidal worker` on a free port, returned once /readyz answers 200."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "server.cli", "worker", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"worker exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("worker did not become ready")


def rss_bytes(pid: int) -> int:
    """Resident set size of process `pid`, from /proc (VmRSS, in kB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def poisson_times(rate_rps: float, seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.standard_exponential(int(rate_rps * seconds * 1.2) + 10) / rate_rps)
    return times[times < seconds]


class Load(threading.Thread):
    """`tidal loadgen`'s replay of `times` against `url`, on its own thread and loop."""

    def __init__(self, url: str, times: np.ndarray, payloads, content_type: str) -> None:
        super().__init__(daemon=True)
        self.url, self.times = url, times
        self.payloads, self.content_type = payloads, content_type
        self.results: list = []

    def run(self) -> None:
        sending = replay(self.url, self.times, self.payloads, 512, self.content_type)
        self.results = asyncio.run(sending)


def slope_mib_per_h(samples: list[tuple[float, int]]) -> float:
    t = np.array([s for s, _ in samples]) / 3600.0
    rss = np.array([b for _, b in samples]) / MIB
    return float(np.polyfit(t, rss, 1)[0]) if len(samples) >= 2 else 0.0


def sample_rss(pid: int, load: Load, every_s: float) -> list[tuple[float, int]]:
    """(seconds since the load began, RSS bytes) every `every_s` until the load ends."""
    started = time.monotonic()
    samples = []
    while True:
        samples.append((time.monotonic() - started, rss_bytes(pid)))
        load.join(timeout=max(0.0, started + len(samples) * every_s - time.monotonic()))
        if not load.is_alive():
            if time.monotonic() - started > samples[-1][0] + 1.0:
                samples.append((time.monotonic() - started, rss_bytes(pid)))
            return samples


def figures(samples: list[tuple[float, int]], summary: dict, args) -> dict:
    second_half = [s for s in samples if s[0] >= samples[-1][0] / 2]
    return {
        "benchmark": "soak",
        "minutes": args.minutes,
        "rate_rps": args.rate,
        "pooled": args.pooled,
        "requests": summary["requests"],
        "ok": summary["ok"],
        "failed": summary["requests"] - summary["ok"],
        "by_status": summary["by_status"],
        "latency_ms": summary["latency_ms"],
        "rss_start_mib": round(samples[0][1] / MIB, 2),
        "rss_end_mib": round(samples[-1][1] / MIB, 2),
        "rss_max_mib": round(max(b for _, b in samples) / MIB, 2),
        "slope_mib_per_h": round(slope_mib_per_h(samples), 3),
        "slope_second_half_mib_per_h": round(slope_mib_per_h(second_half), 3),
        "samples": [(round(t, 1), round(b / MIB, 2)) for t, b in samples],
    }


def print_table(result: dict) -> None:
    print(f"{'t s':>7} {'RSS MiB':>9}")
    for t, mib in result["samples"]:
        print(f"{t:>7.1f} {mib:>9.2f}")
    print(
        f"\nrequests {result['requests']:,}, failed {result['failed']:,} {result['by_status']}, "
        f"p99 {result['latency_ms']['p99']} ms"
    )
    print(
        f"RSS start {result['rss_start_mib']} MiB, end {result['rss_end_mib']} MiB, "
        f"max {result['rss_max_mib']} MiB; slope {result['slope_mib_per_h']} MiB/h "
        f"(second half {result['slope_second_half_mib_per_h']} MiB/h)"
    )


def soak(args) -> dict:
    model = load_model("demo-cnn")
    payloads, content_type = encode_payloads(model, "binary")
    with contextlib.ExitStack() as stack:
        pooled = []
        if args.pooled:  # a private redis-server; the worker reports to it every second
            url = stack.enter_context(redis_server())
            pooled = ["--redis", url, "--pool", "soak", "--name", "soak"]
        process, url = start_worker("--model", "demo-cnn", *pooled)
        stack.callback(process.wait, 30)
        stack.callback(process.terminate)
        times = poisson_times(args.rate, args.minutes * 60, args.seed)
        load = Load(url, times, payloads, content_type)
        load.start()
        samples = sample_rss(process.pid, load, args.every)
    return figures(samples, summarise(load.results, args.minutes * 60), args)


def redis_server():
    """The tests' private redis-server (free port, no disk): one way to start it."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from redis_server import redis_server as server

    return server()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=50.0, help="req/s, Poisson")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pooled",
        action="store_true",
        help="the worker in a pool on a private redis-server (its link reports each second)",
    )
    args = parser.parse_args(argv)
    result = soak(args)
    print_table(result)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
