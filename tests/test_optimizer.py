"""The config optimiser: ranking by hand on a tiny table, and its predictions against the engine."""

import math

import numpy as np
import pytest

from adaptive.config import BatchConfig
from adaptive.latency import LinearLatency
from adaptive.optimizer import ConfigOptimizer, PerformanceTable
from simulations.calibration import performance_table
from simulations.engine import PoolSettings, SimulatedPool

INF = math.inf


def tiny_table() -> PerformanceTable:
    # Two rates; configs (cap, timeout): (8, 0), (8, 5 ms), (32, 5 ms).
    return PerformanceTable(
        rates_rps=np.array([100.0, 1000.0]),
        caps=np.array([8, 8, 32]),
        timeouts_s=np.array([0.0, 0.005, 0.005]),
        p99_s=np.array([[0.010, 0.050], [0.015, 0.030], [0.015, 0.020]]),
        mean_latency_s=np.array([[0.005, 0.020], [0.008, 0.015], [0.009, 0.012]]),
        busy_per_request_s=np.array([[0.004, 0.002], [0.003, 0.0015], [0.003, 0.001]]),
        workers=1,
        description="by hand",
    )


def test_cheapest_config_that_meets_the_target_wins_ties_go_to_lower_mean_latency():
    optimizer = ConfigOptimizer(tiny_table(), slo_s=0.05, margin=0.8)  # target 40 ms
    low = optimizer.choose(100.0)
    # (8, 5ms) and (32, 5ms) cost the same (3 ms/request); (8, 5ms) has the lower mean.
    assert low.config == BatchConfig(8, 0.005) and low.meets_slo
    high = optimizer.choose(1000.0)
    assert high.config == BatchConfig(32, 0.005)  # (8, 0) misses 40 ms; (32) is cheapest
    assert [a.config.max_batch_size for a in high.alternatives] == [8, 32]


def test_interpolates_in_log_rate_and_respects_min_cap():
    table = tiny_table()
    p99, _, _ = table.at(math.sqrt(100.0 * 1000.0))  # halfway in log-rate
    assert p99 == pytest.approx([0.030, 0.0225, 0.0175])
    optimizer = ConfigOptimizer(table, slo_s=0.05)
    assert optimizer.choose(100.0, min_cap=32).config.max_batch_size == 32


def test_best_effort_when_nothing_meets_the_target():
    optimizer = ConfigOptimizer(tiny_table(), slo_s=0.01, margin=0.8)  # 8 ms: nothing
    choice = optimizer.choose(1000.0)
    assert not choice.meets_slo
    assert choice.config == BatchConfig(32, 0.005)  # the lowest predicted p99


@pytest.fixture(scope="module")
def table():
    latency = LinearLatency(base_s=0.004, per_item_s=0.0005)
    return latency, performance_table(latency, workers=2, slo_s=0.1, padded=False)


@pytest.mark.parametrize("fraction", [0.08, 0.25, 0.45, 0.7])
def test_predicted_p99_matches_the_engine_between_grid_rates(table, fraction):
    """The optimiser's choice at an off-grid rate, run on the engine with fresh arrivals:
    the simulated p99 is within 15% (or 2 ms) of the prediction."""
    latency, compiled = table
    optimizer = ConfigOptimizer(compiled, slo_s=0.1)
    capacity = 2 * 256 / latency.mean_s(np.array([256.0]))[0]
    rate = fraction * capacity * 1.037  # off the 15% grid
    choice = optimizer.choose(rate)
    assert choice.meets_slo
    predicted = optimizer.predicted_p99_s(choice.config, rate)
    rng = np.random.default_rng(12345)
    arrivals = np.cumsum(rng.standard_exponential(200_000) / rate)
    pool = SimulatedPool(PoolSettings(2, 0.1), latency, np.random.default_rng(1))
    measured = pool.advance(0.0, math.inf, arrivals, choice.config).p99_s
    assert measured == pytest.approx(predicted, rel=0.15, abs=0.002)
    assert measured <= 0.1
