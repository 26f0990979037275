"""The worker on the bus: stats out every interval, newer configs in, pool merge exact."""

import asyncio

import pytest
from test_worker_batcher import EchoRunner

from adaptive.bus import InMemoryBus, VersionedConfig, WorkerStats, pool_stats
from adaptive.config import BatchConfig
from adaptive.controller import Controller, ControllerSettings
from adaptive.guards import Guardrails
from adaptive.histogram import BUCKET_LOWER_S, NUM_BUCKETS
from adaptive.specs import PolicyContext, build_policy
from server.clock import WallClock
from server.worker.batching import DynamicBatcher
from server.worker.reporter import StatsReporter


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
    merged = pool_stats([a, b], ended_at=10.0, workers=2)
    seen = merged.observation
    assert (seen.arrivals, seen.completed, seen.queue_depth, seen.batches) == (200, 200, 6, 38)
    assert seen.mean_batch_size == pytest.approx((25 * 4 + 12 * 8 + 4) / 38)
    assert seen.batch_fill_ratio == pytest.approx((25 * 0.5 + 12 * 1.0 + 0.5) / 38)
    assert seen.utilization == pytest.approx(0.5 / 2)
    assert seen.latency_p50_s == pytest.approx(0.020, rel=0.02)  # rank 100 of 200
    assert seen.latency_p99_s == pytest.approx(0.020, rel=0.02)
    assert merged.warmup.warmed == (1, 2, 4) and merged.config_version == 1
    assert NUM_BUCKETS > 100


def test_worker_reports_every_interval_and_takes_only_newer_configs():
    async def scenario():
        bus = InMemoryBus()
        batcher = DynamicBatcher(EchoRunner(), BatchConfig(8, 0.001), warm_at_start=False)
        await batcher.start()
        reporter = StatsReporter(batcher, bus, "pool", "w1", interval_s=0.05)
        reporter.start()
        await asyncio.gather(*(batcher.submit(i) for i in range(100)))
        bus.publish_config("pool", VersionedConfig(5, BatchConfig(16, 0.002)))
        await asyncio.sleep(0.12)
        applied = (batcher.config, batcher.version)
        batcher.version = 9  # a worker already ahead ignores an older config
        bus.publish_config("pool", VersionedConfig(7, BatchConfig(2, 0.0)))
        await asyncio.sleep(0.12)
        await reporter.stop()
        await batcher.drain()
        return applied, batcher, bus.take_worker_stats("pool")

    applied, batcher, reports = asyncio.run(scenario())
    assert applied == (BatchConfig(16, 0.002), 5)
    assert batcher.config == BatchConfig(16, 0.002)
    assert len(reports) >= 4
    assert sum(r.arrivals for r in reports) == 100 == sum(r.completed for r in reports)
    assert sum(n for r in reports for _, n in r.latency_buckets) == 100
    assert sum(size * n for r in reports for size, n in r.batch_sizes) == 100


def test_controller_and_worker_close_the_loop_in_process():
    """The live loop on one machine: worker stats -> pool stats -> Controller -> bus ->
    worker, on the wall clock, with the same Controller the simulator runs."""

    async def scenario():
        bus = InMemoryBus()
        batcher = DynamicBatcher(EchoRunner(base_s=0.003), BatchConfig(4, 0.0), warm_at_start=False)
        await batcher.start()
        reporter = StatsReporter(batcher, bus, "pool", "w1", interval_s=0.05)
        reporter.start()
        policy = build_policy("aimd:start=4,step=4,timeout=1ms", PolicyContext(0.1, 1))
        settings = ControllerSettings(pool="pool", tick_s=0.05, guardrails=Guardrails(dwell_s=0.2))
        controller = Controller(policy, bus, WallClock(), settings)
        load = [asyncio.create_task(batcher.submit(i)) for i in range(400)]
        for _ in range(30):
            await asyncio.sleep(0.05)
            reports = bus.take_worker_stats("pool")
            if reports:
                bus.publish_stats("pool", pool_stats(reports, controller.clock.now(), workers=1))
                controller.tick()
        await asyncio.gather(*load)
        await reporter.stop()
        await batcher.drain()
        return controller, batcher

    controller, batcher = asyncio.run(scenario())
    assert controller.config_changes >= 1
    assert batcher.version == controller.version  # the worker runs the latest decision
    assert batcher.config == controller.config
