"""The worker on the bus: stats out every interval, newer configs in, pool merge exact."""

from dataclasses import replace

import numpy as np
import pytest
from numpy.random import default_rng as rng

from adaptive.bus import WorkerStats, observe_pool
from adaptive.config import BatchConfig
from adaptive.histogram import BUCKET_LOWER_S, NUM_BUCKETS, quantile_from_counts
from adaptive.latency import LinearLatency
from adaptive.policy import Snapshot
from simulations.engine import PoolSettings, SimulatedPool
from simulations.run import pool_report


def bucket_of(seconds: float) -> int:
    return int(sum(seconds >= BUCKET_LOWER_S)) - 1


def report(worker, latencies, sizes, cap=8, warmed=(1, 2, 4, 8), version=1):
    buckets: dict[int, int] = {}
    for latency in latencies:
        buckets[bucket_of(latency)] = buckets.get(bucket_of(latency), 0) + 1
    return WorkerStats(
        worker=worker,
        window_s=1.0,
        arrivals=len(latencies),
        completed=len(latencies),
        shed=0,
        latency_buckets=tuple(sorted(buckets.items())),
        latency_sum_s=sum(latencies),
        batch_sizes=tuple(sorted(sizes.items())),
        busy_s=0.25,
        queue_depth=3,
        max_batch_size=cap,
        warmed_buckets=warmed,
        config_version=version,
    )


def test_pool_stats_merge_worker_reports_exactly():
    a = report("a", [0.010] * 99 + [0.200], {4: 25})
    b = report("b", [0.020] * 100, {8: 12, 4: 1}, warmed=(1, 2, 4), version=2)
    merged = observe_pool([a, b], ended_at=10.0, tick_s=1.0, workers=2)
    seen = merged.observation
    assert (seen.arrivals, seen.completed, seen.queue_depth, seen.batches) == (200, 200, 6, 38)
    assert seen.arrival_rate_rps == 200.0
    assert seen.mean_batch_size == pytest.approx((25 * 4 + 12 * 8 + 4) / 38)
    assert seen.batch_fill_ratio == pytest.approx((25 * 0.5 + 12 * 1.0 + 0.5) / 38)
    assert seen.utilization == pytest.approx(0.5 / 2)
    assert seen.latency_p50_s == pytest.approx(0.020, rel=0.02)  # rank 100 of 200
    assert seen.latency_p99_s == pytest.approx(0.020, rel=0.02)
    assert merged.warmed_buckets == (1, 2, 4) and merged.config_version == 1
    assert NUM_BUCKETS > 100


def test_a_tick_holding_two_windows_of_one_worker_is_not_a_surge():
    """Windows are not aligned with ticks: a tick may hold two of one worker's windows.
    Rate and utilisation are per worker-second covered, so they do not double; the
    arrival count is the sum (the forecast sees every arrival once); queue depth is
    each worker's latest level, not a sum over its windows."""
    first = report("a", [0.01] * 50, {5: 10})
    second = replace(report("a", [0.01] * 50, {5: 10}), queue_depth=7)
    other = report("b", [0.01] * 50, {5: 10})
    seen = observe_pool([first, other, second], 3.0, tick_s=1.0, workers=2).observation
    assert seen.arrivals == 150
    assert seen.arrival_rate_rps == 100.0  # 150 arrivals over 3 worker-seconds, 2 workers
    assert seen.utilization == pytest.approx(0.25)  # 0.75 busy s over 3 worker-seconds
    assert seen.queue_depth == 7 + 3
    # The same load reported one window each reads the same.
    aligned = observe_pool([first, other], 2.0, tick_s=1.0, workers=2).observation
    assert aligned.arrival_rate_rps == seen.arrival_rate_rps
    assert aligned.utilization == seen.utilization


def test_a_cold_worker_counts_and_nothing_warm_is_not_warm_up_not_modelled():
    warm = report("a", [0.01], {1: 1}, warmed=(1, 2, 4, 8))
    cold = report("b", [], {}, warmed=())  # just joined, warming its first bucket
    assert observe_pool([warm, cold], 1.0, 1.0, 2).warmed_buckets == ()
    unmodelled = report("c", [0.01], {1: 1}, warmed=None)  # an engine without buckets
    assert observe_pool([unmodelled], 1.0, 1.0, 1).warmed_buckets is None
    observation = observe_pool([unmodelled], 1.0, 1.0, 1).observation

    def snapshot(warmed):
        return Snapshot(1.0, observation, BatchConfig(64, 0.01), 0.1, 1, warmed_buckets=warmed)

    assert snapshot(None).warm_cap == 64  # warm-up not modelled: any batch serves
    assert snapshot(()).warm_cap == 1  # nothing warm: one request at a time
    assert snapshot((1, 2, 4)).serving_cap == 4


def test_the_simulators_own_tick_quantiles_are_the_histograms():
    """The simulated pool's report carries the kernel's p50/p99, which observe_pool takes
    as they are for a lone report: they must be what its histogram says."""
    pool = SimulatedPool(PoolSettings(3, 0.1), LinearLatency(0.005, 0.0004), rng(1))
    arrivals = np.sort(rng(2).uniform(0, 30, 20_000))
    for tick in range(30):
        start, end = float(tick), float(tick + 1)
        chunk = arrivals[(arrivals >= start) & (arrivals < end)]
        stats = pool.advance(start, end, chunk, BatchConfig(16, 0.004))
        report = pool_report(pool, stats, end, 1.0, 1)
        bare = replace(report, latency_p50_s=None, latency_p99_s=None)
        counts = pool.tick_histogram
        assert (report.latency_p50_s, report.latency_p99_s) == (
            quantile_from_counts(counts, 0.5),
            quantile_from_counts(counts, 0.99),
        )
        seen = observe_pool([report], end, 1.0, 3).observation
        again = observe_pool([bare], end, 1.0, 3).observation
        assert (seen.latency_p50_s, seen.latency_p99_s) == (
            again.latency_p50_s,
            again.latency_p99_s,
        )
