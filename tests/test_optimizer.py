"""The config optimiser: ranking by hand on a tiny table, its predictions against the engine,
and what it does with a config or a rate it cannot predict."""

import math

import numpy as np
import pytest

from adaptive.config import BatchConfig
from adaptive.latency import LinearLatency
from adaptive.optimizer import ConfigOptimizer, PerformanceTable
from adaptive.policy import Observation, Snapshot
from adaptive.predictive import PredictivePolicy
from forecaster.forecast import Forecast
from forecaster.models import SeasonalNaive
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


def test_a_config_outside_the_table_is_predicted_as_unknown_not_as_its_edge():
    optimizer = ConfigOptimizer(tiny_table(), slo_s=0.05)
    assert optimizer.outside(BatchConfig(8, 0.005)) is None
    assert optimizer.outside(BatchConfig(8, 0.8)) == (
        "timeout 800ms is outside the planner's table (<= 5ms)"
    )
    assert optimizer.outside(BatchConfig(32, 0.0)) == (
        "timeout 0ms is outside the planner's table (5ms to 5ms)"
    )
    assert optimizer.outside(BatchConfig(64, 0.005)) == (
        "batch 64 is outside the planner's table (<= 32)"
    )
    unknown = optimizer.predict(BatchConfig(8, 0.8), 100.0)
    assert unknown.predicted_p99_s == INF and unknown.busy_per_request_s == INF
    assert optimizer.predicted_p99_s(BatchConfig(64, 0.005), 100.0) == INF
    # A cap between the table's caps is predicted by the next larger one (its bucket).
    assert optimizer.predict(BatchConfig(16, 0.005), 100.0).mean_latency_s == pytest.approx(
        0.009, rel=1e-2
    )
    assert optimizer.predict(BatchConfig(5, 0.004), 100.0).mean_latency_s == pytest.approx(
        0.008, rel=1e-2
    )


@pytest.mark.parametrize("rate", [math.nan, math.inf, -math.inf])
def test_a_non_finite_rate_is_refused_by_name(rate):
    optimizer = ConfigOptimizer(tiny_table(), slo_s=0.05)
    with pytest.raises(ValueError, match="optimiser: arrival rate must be finite, got"):
        optimizer.choose(rate)
    with pytest.raises(ValueError, match="arrival rate must be finite"):
        optimizer.choose(100.0, spread=(rate, 200.0))
    with pytest.raises(ValueError, match="arrival rate must be finite"):
        optimizer.predict(BatchConfig(8, 0.005), rate)


def predictive_snapshot(config: BatchConfig, rate: float, p99_s: float) -> Snapshot:
    step = 10.0
    mean = np.full(30, rate * step)
    forecast = Forecast(np.arange(30) * step, step, mean, 0.9 * mean, 1.1 * mean, 0.9, "x", 0.0)
    seen = Observation(0.0, 1.0, int(rate), int(rate), 0, 0, p99_s / 2, p99_s, 60.0, 0.9, 0.5)
    return Snapshot(0.0, seen, config, slo_s=0.1, workers=2, forecast=forecast)


@pytest.mark.parametrize(
    ("pinned", "why"),
    [
        (BatchConfig(64, 0.8), "timeout 800ms is outside the planner's table (<= 50ms)"),
        (BatchConfig(1024, 0.005), "batch 1024 is outside the planner's table (<= 256)"),
    ],
)
def test_predictive_moves_off_a_config_its_table_cannot_predict(table, pinned, why):
    """After an operator's pin of (64, 800 ms) ends, p99 is 840 ms against a 100 ms SLO:
    the table stops at 50 ms, and snapping 800 ms to that row predicted 55 ms, so the
    policy kept 800 ms as "the cheapest config predicted to meet the SLO"."""
    _, compiled = table
    policy = PredictivePolicy(ConfigOptimizer(compiled, slo_s=0.1), SeasonalNaive())
    decision = policy.decide(predictive_snapshot(pinned, 2000.0, 0.84))
    assert decision.config.timeout_s <= 0.05 and decision.config.max_batch_size <= 256
    assert decision.protective  # the guards apply it at once
    assert decision.reason.startswith(why + ", so its latency cannot be predicted")
    held = policy.decide(predictive_snapshot(decision.config, 2000.0, 0.03))
    assert held.config == decision.config and "outside" not in held.reason


def test_a_prediction_carries_the_config_asked_for_not_one_cached_before():
    # The cache was keyed by (rate band, cap, timeout): after a prediction for the
    # config in force with warm-ahead, predictive's own plain config came back with that
    # warm target, and it warmed buckets (on the promotion day, 128 at 00:14:46) that
    # its forecast did not need.
    optimizer = ConfigOptimizer(tiny_table(), slo_s=0.05)
    optimizer.predict(BatchConfig(8, 0.005, 32), 100.0)
    assert optimizer.predict(BatchConfig(8, 0.005), 100.0).config == BatchConfig(8, 0.005)


def test_a_table_is_the_same_on_one_core_as_on_every_core():
    """The live controller rebuilds on one core beside its workers: the table it gets is
    the one every core would compile (each config sweeps on its own seed)."""
    latency = LinearLatency(base_s=0.004, per_item_s=0.0005)
    one, every = (
        performance_table(latency, 1, 0.05, padded=False, cached=False, threads=threads)
        for threads in (1, 4)
    )
    for name in (
        "rates_rps",
        "caps",
        "timeouts_s",
        "p99_s",
        "mean_latency_s",
        "busy_per_request_s",
    ):
        np.testing.assert_array_equal(getattr(one, name), getattr(every, name))
