"""Simulator speed: Tidal's compiled engine against an independent SimPy model.

Both replay the same Poisson arrivals through W workers sharing one queue under the
batching rule of docs/batching.md (max batch 32, timeout 10 ms, service linear:2,0.25,
4 workers). The SimPy model is written from the rule, not from Tidal's code: a queue
process per worker that waits for a full batch or the oldest request's timeout.
Mean and p99 latency must agree within 2%; the figure of merit is simulated requests
per wall-clock second, and their ratio.

    python benchmarks/sim_speed.py [--requests 1000000] [--rate 12000]

Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import deque

import numpy as np
import simpy

from adaptive.config import BatchConfig
from adaptive.latency import LinearLatency
from adaptive.policy import StaticPolicy
from simulations.engine import PoolSettings
from simulations.run import SimulationSettings, simulate
from simulations.traces import RequestTrace

MAX_BATCH, TIMEOUT_S, WORKERS = 32, 0.010, 4
BASE_S, PER_ITEM_S = 0.002, 0.00025


def simpy_latencies(arrivals: np.ndarray) -> np.ndarray:
    """Latency of every request under the batching rule, modelled in SimPy."""
    env = simpy.Environment()
    queue: deque[float] = deque()
    changed = env.event()
    latencies: list[float] = []

    def source():
        nonlocal changed
        for t in arrivals:
            yield env.timeout(t - env.now)
            queue.append(t)
            changed.succeed()
            changed = env.event()

    def worker():
        while True:
            if not queue:
                yield changed
            elif len(queue) >= MAX_BATCH or env.now >= queue[0] + TIMEOUT_S:
                batch = [queue.popleft() for _ in range(min(MAX_BATCH, len(queue)))]
                yield env.timeout(BASE_S + PER_ITEM_S * len(batch))
                latencies.extend(env.now - a for a in batch)
            else:  # wait for the batch to fill or the oldest request's timeout
                yield changed | env.timeout(queue[0] + TIMEOUT_S - env.now)

    env.process(source())
    for _ in range(WORKERS):
        env.process(worker())
    env.run()
    return np.array(latencies)


def tidal_summary(arrivals: np.ndarray):
    trace = RequestTrace("poisson", arrivals)
    settings = SimulationSettings(PoolSettings(WORKERS, slo_s=0.1))
    policy = StaticPolicy(BatchConfig(MAX_BATCH, TIMEOUT_S))
    return simulate(trace, [policy], settings, LinearLatency(BASE_S, PER_ITEM_S)).results[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=12_000.0, help="Poisson rate, req/s")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    arrivals = np.cumsum(rng.exponential(1.0 / args.rate, args.requests))
    arrivals -= arrivals[0]

    tidal_summary(arrivals[:1000])  # compile (or load) the kernel outside the timing
    started = time.perf_counter()
    tidal = tidal_summary(arrivals)
    tidal_wall = time.perf_counter() - started
    started = time.perf_counter()
    reference = simpy_latencies(arrivals)
    simpy_wall = time.perf_counter() - started

    figures = {
        "requests": args.requests,
        "rate_rps": args.rate,
        "tidal_wall_s": round(tidal_wall, 3),
        "simpy_wall_s": round(simpy_wall, 3),
        "tidal_sim_requests_per_s": round(args.requests / tidal_wall),
        "simpy_sim_requests_per_s": round(args.requests / simpy_wall),
        "speedup": round(simpy_wall / tidal_wall, 1),
        "tidal_mean_ms": round(tidal.latency.mean_s * 1e3, 4),
        "simpy_mean_ms": round(reference.mean() * 1e3, 4),
        "tidal_p99_ms": round(tidal.latency.p99_s * 1e3, 4),
        "simpy_p99_ms": round(float(np.quantile(reference, 0.99, method="inverted_cdf")) * 1e3, 4),
    }
    figures["mean_rel_diff"] = round(
        abs(figures["tidal_mean_ms"] / figures["simpy_mean_ms"] - 1), 5
    )
    figures["p99_rel_diff"] = round(abs(figures["tidal_p99_ms"] / figures["simpy_p99_ms"] - 1), 5)
    figures["agree_within_2pct"] = (
        figures["mean_rel_diff"] < 0.02 and figures["p99_rel_diff"] < 0.02
    )
    print(f"{'engine':<8} {'wall s':>8} {'sim req/s':>12} {'mean ms':>9} {'p99 ms':>9}")
    for name in ("tidal", "simpy"):
        print(
            f"{name:<8} {figures[name + '_wall_s']:>8.2f} "
            f"{figures[name + '_sim_requests_per_s']:>12,} {figures[name + '_mean_ms']:>9.3f} "
            f"{figures[name + '_p99_ms']:>9.3f}"
        )
    print(
        f"speed-up {figures['speedup']}x; mean differs {figures['mean_rel_diff']:.3%}, "
        f"p99 {figures['p99_rel_diff']:.3%}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
