"""Compile the optimiser's `PerformanceTable` by running the engine on Poisson load.

For every candidate config (power-of-two caps, timeouts as fractions of the SLO) and a
geometric grid of pool arrival rates, one engine run of a few tens of thousands of
requests measures p99, mean latency and busy seconds per request. Rates are swept
upwards and a config stops at the first rate it cannot keep up with. When the latency
model carries the time a request spends outside the batcher (a profile taken under
load), the latencies are the client's: the worker's plus that overhead at each rate, so
the planner charges it against the SLO at the rate it plans for. A table costs a
few seconds and is cached per (latency model, pool, SLO) for the life of the process.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from adaptive.config import BatchConfig
from adaptive.latency import LatencyModel, max_feasible_batch
from adaptive.optimizer import PerformanceTable
from simulations.engine import PoolSettings, Routing, SimulatedPool

TIMEOUT_FRACTIONS_OF_SLO = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5)
LARGEST_CAP = 256
RATE_STEP = 1.15
"""Neighbouring grid rates differ by 15%; interpolation between them stays within a few %."""
SATURATED = 0.97
"""Utilisation (at full batches) past which a config is taken as unable to keep up."""


_TABLES: dict[tuple[object, ...], PerformanceTable] = {}


def performance_table(
    latency: LatencyModel,
    workers: int,
    slo_s: float,
    padded: bool,
    routing: Routing = Routing.SHARED,
    seed: int = 0,
    cached: bool = True,
    threads: int | None = None,
) -> PerformanceTable:
    """The table for one pool; `padded` when batches run padded to warmed buckets.
    `cached=False` for a model that will not recur (one learned from serving): the
    process-wide cache would otherwise keep every table a long-running controller built.
    `threads` sweeps configs on that many cores (None: all); each config has its own seed,
    so the table is the same whatever the count."""
    # The overhead is in the key: a linear model describes itself by its spec alone.
    key = (latency.describe(), latency.overhead, workers, slo_s, padded, routing, seed)
    threads = threads or os.cpu_count() or 1
    if not cached:
        return _TABLES.get(key) or _compile(latency, workers, slo_s, padded, routing, seed, threads)
    if key not in _TABLES:
        _TABLES[key] = _compile(latency, workers, slo_s, padded, routing, seed, threads)
    return _TABLES[key]


def _compile(
    latency: LatencyModel,
    workers: int,
    slo_s: float,
    padded: bool,
    routing: Routing,
    seed: int,
    threads: int,
) -> PerformanceTable:
    caps = _caps(latency)
    full_batch_s = latency.mean_s(caps.astype(np.float64))  # powers of two: padding is a no-op
    rates = _rate_grid(workers, caps, full_batch_s)
    configs = [
        (int(cap), round(slo_s * fraction, 6))
        for cap in caps
        for fraction in TIMEOUT_FRACTIONS_OF_SLO
    ]
    settings = PoolSettings(workers, slo_s, routing, warmup_s=1.0 if padded else 0.0)
    capacity = dict(zip(caps.tolist(), workers * caps / full_batch_s, strict=True))
    seeds = np.random.SeedSequence(seed).spawn(len(configs))

    def sweep(index: int) -> np.ndarray:
        cap, timeout_s = configs[index]
        return _sweep(
            latency, settings, BatchConfig(cap, timeout_s), rates, capacity[cap], seeds[index]
        )

    # The kernel releases the GIL: configs sweep on `threads` cores. On one, in the
    # calling thread: a live rebuild runs on a daemon thread that a stopping controller
    # does not wait for, and an executor's threads are joined at exit whatever calls them.
    if threads == 1:
        rows = np.stack([sweep(i) for i in range(len(configs))])
    else:
        with ThreadPoolExecutor(max_workers=threads) as executor:
            rows = np.stack(list(executor.map(sweep, range(len(configs)))))
    p99, mean, busy = rows[:, 0], rows[:, 1], rows[:, 2]
    return PerformanceTable(
        rates_rps=rates,
        caps=np.array([c for c, _ in configs]),
        timeouts_s=np.array([t for _, t in configs]),
        p99_s=p99,
        mean_latency_s=mean,
        busy_per_request_s=busy,
        workers=workers,
        description=f"{latency.describe()}, {workers} workers, {routing.value}"
        + (", padded to power-of-two buckets" if padded else "")
        + (", client latency (with the overhead outside the batcher)" if latency.overhead else ""),
    )


def _caps(latency: LatencyModel) -> np.ndarray:
    limit = max_feasible_batch(latency) or LARGEST_CAP
    caps = [1 << i for i in range(LARGEST_CAP.bit_length()) if 1 << i <= limit]
    return np.array(caps)


def _rate_grid(workers: int, caps: np.ndarray, full_batch_s: np.ndarray) -> np.ndarray:
    highest = float((workers * caps / full_batch_s).max())
    lowest = workers / float(full_batch_s[0]) * 0.01
    steps = math.ceil(math.log(highest / lowest) / math.log(RATE_STEP))
    return lowest * RATE_STEP ** np.arange(steps + 1)


def _sweep(
    latency: LatencyModel,
    settings: PoolSettings,
    config: BatchConfig,
    rates: np.ndarray,
    capacity_rps: float,
    seed: np.random.SeedSequence,
) -> np.ndarray:
    """(p99, mean, busy per request) x rates for one config; inf once it cannot keep up."""
    measured = np.full((3, rates.size), np.inf)
    rng = np.random.default_rng(seed)
    for column, rate in enumerate(rates):
        if rate > SATURATED * capacity_rps:
            break
        measured[:, column] = _measure(latency, settings, config, rate, rng)
        if measured[0, column] > 20 * settings.slo_s:
            measured[:, column] = np.inf
            break
    return measured


def _requests_for(cap: int, workers: int) -> int:
    # Enough batches per worker to reach steady state, enough requests for a stable p99.
    return int(np.clip(40 * cap * workers, 10_000, 50_000))


def _measure(
    latency: LatencyModel,
    settings: PoolSettings,
    config: BatchConfig,
    rate_rps: float,
    rng: np.random.Generator,
) -> tuple[float, float, float]:
    """(p99, mean latency, busy seconds per request) of one config under Poisson load:
    the client's latencies when the model carries an overhead, else the worker's."""
    n = _requests_for(config.max_batch_size, settings.workers)
    arrivals = np.cumsum(rng.standard_exponential(n) / rate_rps)
    pool = SimulatedPool(settings, latency, np.random.default_rng(rng.integers(2**63)))
    stats = pool.advance(0.0, math.inf, arrivals, config, rate_rps=rate_rps)
    p99, latency_sum_s = stats.p99_s, stats.latency_sum_s
    if pool.client_account:
        p99, latency_sum_s = stats.client_p99_s, stats.client_latency_sum_s
    busy_per_request_s = stats.busy_s / stats.completed
    return (math.inf if p99 is None else p99), latency_sum_s / stats.completed, busy_per_request_s
