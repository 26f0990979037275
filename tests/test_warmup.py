"""Warm-up of batch-size buckets: the tracker's state machine and its effect in the engine."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptive.config import BatchConfig
from adaptive.latency import LinearLatency
from adaptive.warmup import WarmupTracker, bucket_for, buckets_through, buckets_to_warm
from simulations.engine import PoolSettings, SimulatedPool


def test_buckets_are_powers_of_two_through_the_cap():
    assert [bucket_for(n) for n in (1, 2, 3, 5, 8, 9, 100)] == [1, 2, 4, 8, 8, 16, 128]
    assert buckets_through(48) == (1, 2, 4, 8, 16, 32, 64)
    assert buckets_to_warm(32, 128) == (64, 128)
    assert buckets_to_warm(40, 64) == ()  # 40 already needs bucket 64


def test_raising_the_cap_warms_one_bucket_after_another():
    tracker = WarmupTracker(warmup_s=20.0, initial_cap=8)
    tracker.request(64, now=100.0)
    assert [tracker.effective_cap(64, t) for t in (100, 119.9, 120, 139.9, 140)] == [
        8, 8, 16, 16, 32,
    ]  # fmt: skip
    assert tracker.status(150.0).warming == (64,)
    assert tracker.effective_cap(64, 160.0) == 64
    assert tracker.status(160.0).warmed == (1, 2, 4, 8, 16, 32, 64)


def test_lowering_is_instant_and_releases_buckets():
    tracker = WarmupTracker(warmup_s=20.0, initial_cap=128)
    tracker.request(16, now=0.0)
    assert tracker.effective_cap(16, 0.0) == 16
    assert tracker.status(0.0).warmed[-1] == 16
    tracker.request(32, now=1.0)  # released buckets must warm again
    assert tracker.effective_cap(32, 20.9) == 16
    assert tracker.effective_cap(32, 21.0) == 32


def test_a_lower_request_cancels_warming_above_it():
    tracker = WarmupTracker(warmup_s=10.0, initial_cap=8)
    tracker.request(128, now=0.0)
    tracker.request(16, now=5.0)
    assert tracker.status(5.0).warming == (16,)
    assert tracker.effective_cap(128, 100.0) == 16


@given(
    requests=st.lists(
        st.tuples(st.integers(1, 300), st.floats(0, 50, allow_nan=False)), min_size=1, max_size=20
    )
)
def test_effective_cap_never_exceeds_what_was_asked_or_warmed(requests):
    tracker = WarmupTracker(warmup_s=7.0, initial_cap=4)
    now = 0.0
    for cap, gap in requests:
        now += gap
        tracker.request(cap, now)
        served = tracker.effective_cap(cap, now)
        assert 1 <= served <= cap
        assert bucket_for(served) <= tracker.status(now).warm_cap
    # With time, every bucket the last cap needs is warm.
    assert tracker.effective_cap(requests[-1][0], now + 7.0 * 10) == requests[-1][0]


def test_engine_pads_batches_and_serves_the_old_cap_while_warming():
    latency = LinearLatency(base_s=0.005, per_item_s=0.001)
    pool = SimulatedPool(
        PoolSettings(1, slo_s=1.0, warmup_s=20.0), latency, np.random.default_rng(0)
    )
    # Five requests at once under cap 8: one batch padded to bucket 8 (5 + 8 ms = 13 ms).
    stats = pool.advance(0.0, 1.0, np.zeros(5), BatchConfig(8, 0.0))
    assert stats.batches == 1 and stats.busy_s == pytest.approx(0.013)
    # Asking for 32 at t=1 s: bucket 16 is ready at 21 s, 32 at 41 s.
    served = []
    for t in range(1, 45):
        pool.advance(float(t), t + 1.0, np.full(40, t + 0.5), BatchConfig(32, 0.0))
        served.append(pool.served_max_batch)
    assert served[:20] == [8] * 20 and served[20:40] == [16] * 20 and served[40:] == [32] * 4


def test_without_warmup_batches_are_not_padded():
    latency = LinearLatency(base_s=0.005, per_item_s=0.001)
    pool = SimulatedPool(PoolSettings(1, slo_s=1.0), latency, np.random.default_rng(0))
    stats = pool.advance(0.0, 1.0, np.zeros(5), BatchConfig(8, 0.0))
    assert stats.busy_s == pytest.approx(0.010)
    pool.advance(1.0, 2.0, np.full(40, 1.5), BatchConfig(32, 0.0))
    assert pool.served_max_batch == 32
