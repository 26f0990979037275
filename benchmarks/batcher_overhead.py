"""Batcher overhead: how late the live batcher dispatches, and what it costs per request.

In process, no HTTP: Poisson arrivals at 5,000 req/s offered to `DynamicBatcher` with a
model that takes no time, one instance, max batch 32, timeout 2 ms. For every batch,
the gap between the instant the batching rule says it is due (the later of its deadline
and the instant an instance became free) and the instant the loop dispatched it. The
baseline beside it is the same arrivals driven through `adaptive.Batcher` alone (no
event loop), which prices the state machine itself.

Target (issue 5): p99 dispatch gap under 1 ms.

    PYTHONPATH=. python benchmarks/batcher_overhead.py [--rate 5000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import numpy as np

from adaptive.batcher import Batcher
from adaptive.config import BatchConfig
from server.worker.batching import DynamicBatcher

CONFIG = BatchConfig(32, 0.002)


class Instant:
    def run(self, inputs, padded_size):
        return list(inputs)

    def warm(self, size):
        return 0.0


async def drive(arrivals: np.ndarray) -> tuple[list[float], float, float]:
    batcher = DynamicBatcher(Instant(), CONFIG, warm_at_start=False)
    gaps: list[float] = []
    batcher.on_dispatch = gaps.append
    await batcher.start()
    started_wall, started_cpu = time.perf_counter(), time.process_time()
    origin = time.monotonic()
    tasks = []
    for i, at in enumerate(arrivals):
        delay = at - (time.monotonic() - origin)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(batcher.submit(i)))
    await asyncio.gather(*tasks)
    wall, cpu = time.perf_counter() - started_wall, time.process_time() - started_cpu
    await batcher.drain()
    return gaps, wall, cpu


def state_machine_only(arrivals: np.ndarray) -> float:
    """CPU seconds to offer and dispatch the same arrivals through `Batcher` alone."""
    batcher: Batcher[int] = Batcher(CONFIG)
    started = time.process_time()
    for i, at in enumerate(arrivals):
        batcher.offer(i, at)
        while batcher.take_nowait(at) is not None:
            pass
    batcher.drain()
    return time.process_time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=5000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.standard_exponential(int(args.rate * args.seconds)) / args.rate)
    gaps, wall, cpu = asyncio.run(drive(arrivals))
    machine_cpu = state_machine_only(arrivals)
    gaps_ms = np.array(gaps) * 1e3
    n = arrivals.size
    figures = {
        "requests": n,
        "batches": len(gaps),
        "offered_rps": args.rate,
        "dispatch_gap_ms": {
            "p50": round(float(np.quantile(gaps_ms, 0.5)), 4),
            "p99": round(float(np.quantile(gaps_ms, 0.99)), 4),
            "max": round(float(gaps_ms.max()), 4),
        },
        "shell_cpu_us_per_request": round(cpu / n * 1e6, 2),
        "state_machine_cpu_us_per_request": round(machine_cpu / n * 1e6, 3),
        "wall_s": round(wall, 3),
        "meets_p99_under_1ms": bool(np.quantile(gaps_ms, 0.99) < 1.0),
    }
    print(f"{n:,} requests at {args.rate:,.0f} req/s, {len(gaps):,} batches")
    print(f"{'':<34} {'p50':>8} {'p99':>8} {'max':>8}")
    g = figures["dispatch_gap_ms"]
    print(f"{'dispatch gap, ms':<34} {g['p50']:>8} {g['p99']:>8} {g['max']:>8}")
    print(f"{'asyncio shell CPU per request':<34} {figures['shell_cpu_us_per_request']:>8} us")
    alone = figures["state_machine_cpu_us_per_request"]
    print(f"{'state machine alone per request':<34} {alone:>8} us")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
