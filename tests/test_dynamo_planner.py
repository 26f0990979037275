"""The Dynamo-style planner and its load predictors: Dynamo's documented rules, by hand.

The planner sizes replicas every interval as Dynamo's SLA planner sizes single-batch
engines: ceil(predicted count / interval x min(1, correction) / throughput per replica),
the throughput read from a one-replica profile at the SLO.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive.config import BatchConfig
from adaptive.dynamo_planner import DynamoPlannerPolicy, throughput_per_replica
from adaptive.fleet import FleetView
from adaptive.latency import LinearLatency
from adaptive.optimizer import ConfigOptimizer
from adaptive.policy import Observation, Snapshot
from adaptive.specs import PolicyContext, build_policy
from forecaster.interval_predictors import (
    ArimaPredictor,
    ConstantPredictor,
    KalmanPredictor,
    build_interval_predictor,
)
from tidal_base.errors import InvalidInput

CONFIG = BatchConfig(32, 0.01)


@pytest.fixture(scope="module")
def optimizer() -> ConfigOptimizer:
    """One replica of linear:5,0.4 (SLO 100 ms), as the simulator's shells compile it."""
    from simulations.calibration import performance_table

    table = performance_table(LinearLatency(0.005, 0.0004), 1, 0.1, False)
    return ConfigOptimizer(table, 0.1, margin=1.0)


def snapshot(now: float, rps: float, ready: int, p99_s: float | None = None) -> Snapshot:
    observation = Observation(
        now, 1.0, int(rps), int(rps), 0, 0, None, p99_s, 8.0, 0.5, 0.5, rate_rps=rps
    )
    fleet = FleetView(ready, 0, ready)
    return Snapshot(now, observation, CONFIG, 0.1, ready, fleet=fleet)


def test_the_constant_predictor_repeats_the_last_interval():
    predictor = ConstantPredictor()
    assert predictor.predict() == 0.0
    for count in (5.0, 9.0, 4.0):
        predictor.observe(count)
    assert predictor.predict() == 4.0


@pytest.mark.parametrize(
    "predictor", [KalmanPredictor(), ArimaPredictor()], ids=["kalman", "arima"]
)
def test_trend_predictors_follow_a_ramp_and_wait_for_their_minimum_history(predictor):
    counts = [1000.0 + 100.0 * i for i in range(30)]
    for i, count in enumerate(counts):
        predictor.observe(count)
        if i < 4:  # fewer than min_points (5): the last count, as Dynamo's do
            assert predictor.predict() == count
    assert predictor.predict() == pytest.approx(counts[-1] + 100.0, rel=0.02)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=60), st.sampled_from(["kalman", "arima"]))
def test_a_prediction_is_a_finite_count(counts, name):
    predictor = build_interval_predictor(name)
    for count in counts:
        predictor.observe(count)
    predicted = predictor.predict()
    assert math.isfinite(predicted) and predicted >= 0


def test_the_throughput_per_replica_is_the_profiles_highest_rate_within_the_slo(optimizer):
    rps = throughput_per_replica(optimizer, CONFIG)
    assert optimizer.predicted_p99_s(CONFIG, rps) <= 0.1
    above = optimizer.table.rates_rps[optimizer.table.rates_rps > rps]
    assert all(optimizer.predicted_p99_s(CONFIG, float(r)) > 0.1 for r in above)


def test_the_planner_holds_until_an_interval_has_passed_then_sizes_for_the_prediction(
    optimizer,
):
    policy = DynamoPlannerPolicy(CONFIG, optimizer, ConstantPredictor(), interval_s=180.0)
    per_replica = policy.replica_rps
    load = 3.5 * per_replica  # needs ceil(3.5) = 4 replicas
    answers = [policy.decide(snapshot(float(t), load, 2)).replicas for t in range(1, 181)]
    assert answers[:-1] == [2] * 179  # the replicas desired, until the first plan
    assert answers[-1] == 4
    assert "constant predicts" in policy.decide(snapshot(181.0, load, 4)).reason
    # The plan holds for the interval, whatever the load does inside it.
    assert policy.decide(snapshot(200.0, 10 * load, 4)).replicas == 4


def test_a_correction_under_one_lowers_the_load_and_over_one_is_ignored(optimizer):
    def plan(p99_ratio: float) -> int:
        policy = DynamoPlannerPolicy(CONFIG, optimizer, ConstantPredictor(), interval_s=10.0)
        load = 3.5 * policy.replica_rps
        expected = optimizer.predicted_p99_s(CONFIG, load / 4)
        answers = [
            policy.decide(snapshot(float(t), load, 4, expected * p99_ratio)).replicas
            for t in range(1, 11)
        ]
        return answers[-1]

    assert plan(1.0) == 4
    assert plan(3.0) == 4  # min(1, correction): queueing does not add replicas
    assert plan(0.5) == 2  # ceil(3.5 x 0.5): faster than profiled, fewer replicas


def test_the_spec_builds_the_planner_and_refuses_what_it_cannot_run(optimizer):
    table = lambda slo_s: optimizer.table  # noqa: E731
    context = PolicyContext(0.1, 4, replica_table=table, replica_startup_s=90.0)
    policy = build_policy("dynamo-planner:predictor=kalman,interval=60s", context)
    assert isinstance(policy, DynamoPlannerPolicy)
    assert policy.interval_s == 60.0 and policy.predictor.name == "kalman"
    with pytest.raises(InvalidInput, match="unknown load predictor 'prophet'"):
        build_policy("dynamo-planner:predictor=prophet", context)
    with pytest.raises(InvalidInput, match="give the fleet room to scale"):
        build_policy("dynamo-planner", PolicyContext(0.1, 4))
    with pytest.raises(InvalidInput, match="unknown option 'target'"):
        build_policy("dynamo-planner:target=3", context)


def test_a_fixed_fleet_gets_the_static_config_and_no_replica_count(optimizer):
    policy = DynamoPlannerPolicy(CONFIG, optimizer, ConstantPredictor())
    observation = Observation(1.0, 1.0, 10, 10, 0, 0, None, None, 1.0, 1.0, 0.1)
    decision = policy.decide(Snapshot(1.0, observation, CONFIG, 0.1, 4))
    assert decision.config == CONFIG and decision.replicas is None
    assert np.isfinite(policy.replica_rps)
