"""The load generator's own cost: CPU a request of `tidal loadgen`'s replay against
httpx's, on the same arrivals to the same worker, side by side.

The live benchmarks run the client on the two cores the workers use, so what the client
spends is taken from the server it measures. One `tidal worker --model demo-ranker`
(one torch thread, `max_batch=16,timeout=5ms`) serves; this process replays the same
seeded Poisson arrivals at each rate with each client in turn, and reads its own CPU
(every thread of this process, getrusage) and the worker's (/proc) over the replay:

- `httpx`: the replay as it was (an `httpx.AsyncClient`, a task per request), kept here
  as the baseline;
- `lean`: `server.tools.loadgen.replay` (`server.tools.lean_http`), on asyncio's loop;
- `lean+uvloop`: the same on uvloop's.

    PYTHONPATH=. python benchmarks/loadgen_cost.py [--seconds 10] [--rates 100,200,400]

Prints a table (client CPU ms a request, the worker's, p50/p99 the client saw, send lag
p99, requests answered) and, last, one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import tidal_workers, torch_threads_env
from open_loop import cpu_by_label, cpu_snapshot

from server.tools.loadgen import RequestResult, encode_payloads, replay, summarise
from server.worker.models import load_model

MODEL = "demo-ranker"
CONFIG = "max_batch=16,timeout=5ms"


async def httpx_replay(
    url: str, times: np.ndarray, payloads: list[bytes], content_type: str
) -> list[RequestResult]:
    """The baseline: `tidal loadgen`'s replay before lean_http (httpx, a task a request)."""
    results: list[RequestResult] = []
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=60.0, limits=httpx.Limits(max_connections=1000)) as c:

        async def send(i: int, scheduled: float) -> None:
            sent = time.monotonic() - start
            headers = {"content-type": content_type, "x-sent-at": f"{time.time():.6f}"}
            try:
                body = payloads[i % len(payloads)]
                response = await c.post(f"{url}/v1/infer", content=body, headers=headers)
                timing = response.json().get("timing", {}) if response.status_code == 200 else {}
                status = response.status_code
            except httpx.HTTPError:
                timing, status = {}, -1
            latency = time.monotonic() - start - sent
            results.append(
                RequestResult(
                    scheduled, sent, status, latency, None, timing.get("batch_size"), None
                )
            )

        tasks = []
        for i, at in enumerate(times):
            delay = at - (time.monotonic() - start)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(i, float(at))))
        await asyncio.gather(*tasks)
    return results


def _lean(url, times, payloads, ct):
    return replay(url, times, payloads, 1000, ct)


CLIENTS: dict[str, tuple[Callable[..., Coroutine[Any, Any, list[RequestResult]]], Callable]] = {
    "httpx": (httpx_replay, asyncio.run),
    "lean": (_lean, asyncio.run),
    "lean+uvloop": (_lean, uvloop.run),
}
"""Each client: its replay and the event loop it runs on."""


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(name: str, url: str, times: np.ndarray, payloads, ct) -> dict:
    """One client's replay of `times`: its CPU (this process) and the worker's (every
    process below this one) over it, a request each, and what the client saw."""
    client, run = CLIENTS[name]
    before, worker_before = _cpu_s(), cpu_snapshot(os.getpid(), {})
    results = run(client(url, times, payloads, ct))
    client_s = _cpu_s() - before
    worker_after = cpu_snapshot(os.getpid(), {})
    worker_s = sum(cpu_by_label(worker_before, worker_after).values())
    summary = summarise(results, float(times[-1]))
    sent = max(summary["requests"], 1)
    return {
        "client": name,
        "requests": summary["requests"],
        "ok": summary["ok"],
        "client_cpu_ms_per_request": round(client_s / sent * 1e3, 4),
        "worker_cpu_ms_per_request": round(worker_s / sent * 1e3, 4),
        "p50_ms": summary["latency_ms"]["p50"],
        "p99_ms": summary["latency_ms"]["p99"],
        "send_lag_p99_ms": summary["send_lag_p99_ms"],
        "by_status": summary["by_status"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rates", default="100,200,400")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    rows = []
    env = torch_threads_env(1)
    argv = ["--model", MODEL, "--config", CONFIG]
    with tidal_workers(argv, 1, env, Path(tempfile.mkdtemp(prefix="tidal-lc-"))) as (url,):
        payloads, ct = encode_payloads(load_model(MODEL), "binary")
        for rate in rates:
            rng = np.random.default_rng(int(rate))
            times = np.cumsum(rng.exponential(1.0 / rate, int(rate * args.seconds * 1.5)))
            times = times[times < args.seconds]
            for name in CLIENTS:
                row = {"rate_rps": rate, **measure(name, url, times, payloads, ct)}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    header = (
        f"{'rate':>6} {'client':12} {'sent':>6} {'ok':>6} {'client ms/req':>13} "
        f"{'worker ms/req':>13} {'p50 ms':>8} {'p99 ms':>8} {'lag p99':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['rate_rps']:>6.0f} {r['client']:12} {r['requests']:>6} {r['ok']:>6} "
            f"{r['client_cpu_ms_per_request']:>13.3f} {r['worker_cpu_ms_per_request']:>13.3f} "
            f"{r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} {r['send_lag_p99_ms']:>8.1f}"
        )
    print(json.dumps({"model": MODEL, "config": CONFIG, "seconds": args.seconds, "runs": rows}))


if __name__ == "__main__":
    main()
