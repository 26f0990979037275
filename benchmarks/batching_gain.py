"""Batching gain: the demo CNN over HTTP with batching off (max batch 1) and on.

For each worker config, a real `tidal worker` process serves `demo-cnn` on the CPU, and
the open-loop load generator (in this process, binary bodies) offers Poisson load at
rising rates for `--seconds` each. A rate is sustained when at least 98% of requests
succeed, the achieved rate is within 5% of the offered one and p99 is under 500 ms.
Reported per config: the highest sustained rate and its p99, and the ratio on/off.
The client and the worker share this machine's two cores, so the absolute rates are the
machine's, not the model's; the ratio is the figure.

    PYTHONPATH=. python benchmarks/batching_gain.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time

import httpx
import numpy as np

from server.tools.loadgen import encode_payloads, replay, summarise
from server.worker.models import load_model

CONFIGS = {"off": "max_batch=1,timeout=0ms", "on": "max_batch=32,timeout=5ms"}
RATES = (50, 100, 150, 200, 250, 300, 400, 500, 650, 800)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_worker(config: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    command = [sys.executable, "-m", "server.cli", "worker", "--model", "demo-cnn"]
    process = subprocess.Popen([*command, "--port", str(port), "--config", config])
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/v1/stats").json()["warming"] is False:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("worker did not start")


def offer(url: str, rate: float, seconds: float, payloads, content_type) -> dict:
    rng = np.random.default_rng(int(rate))
    times = np.cumsum(rng.standard_exponential(int(rate * seconds * 1.2)) / rate)
    times = times[times < seconds]
    results = asyncio.run(replay(url, times, payloads, 2000, content_type))
    return summarise(results, seconds)


def sustained(summary: dict, rate: float) -> bool:
    p99 = summary["latency_ms"]["p99"]
    return (
        summary["ok"] >= 0.98 * summary["requests"]
        and summary["achieved_rps"] >= 0.95 * rate
        and p99 is not None
        and p99 <= 500
    )


def sweep(name: str, config: str, seconds: float) -> dict:
    process, url = start_worker(config)
    payloads, content_type = encode_payloads(load_model("demo-cnn"), "binary")
    best = None
    try:
        for rate in RATES:
            summary = offer(url, rate, seconds, payloads, content_type)
            ok = sustained(summary, rate)
            print(
                f"{name:>4} {rate:>5} req/s: achieved {summary['achieved_rps']:>7.1f}, p99 "
                f"{summary['latency_ms']['p99']} ms, batch {summary['mean_batch_size']}: "
                f"{'sustained' if ok else 'not sustained'}",
                flush=True,
            )
            if not ok:
                break
            best = {"rate_rps": rate, **summary}
    finally:
        process.terminate()
        process.wait(30)
    return {"config": config, "highest_sustained": best}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    results = {name: sweep(name, config, args.seconds) for name, config in CONFIGS.items()}
    off, on = (results[n]["highest_sustained"] for n in ("off", "on"))
    ratio = on["rate_rps"] / off["rate_rps"] if off and on else None
    print(
        f"\n{'batching':<9} {'config':<26} {'sustained req/s':>15} {'p99 ms':>8} {'mean batch':>10}"
    )
    for name, result in results.items():
        best = result["highest_sustained"] or {}
        print(
            f"{name:<9} {result['config']:<26} {best.get('rate_rps', 0):>15} "
            f"{(best.get('latency_ms') or {}).get('p99')!s:>8} {best.get('mean_batch_size')!s:>10}"
        )
    print(f"throughput ratio on/off: {ratio}")
    print(
        json.dumps(
            {
                "benchmark": "batching_gain",
                "seconds_per_rate": args.seconds,
                "results": results,
                "ratio": ratio,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
