"""The latency model learned from serving: exact blends by hand, decay, drift, the wire,
and a live pool that rebuilds its planner's table when serving runs slower than planned."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive.bus import PoolStats, WorkerStats, observe_pool
from adaptive.controller import Controller, ControllerSettings
from adaptive.latency import LinearLatency, p99_s, parse_latency_model, profile_document
from adaptive.learned_latency import ExecutionTimes, LatencyLearner, LearningSettings
from adaptive.policy import Observation
from adaptive.specs import PolicyContext, build_policy
from server.bus.wire import MalformedStats, decode_stats, encode_stats
from simulations.calibration import performance_table

PRIOR = LinearLatency(0.010, 0.0)  # 10 ms at every size: ratios are easy to read


def batches(size: int, seconds: float, count: int) -> ExecutionTimes:
    return ExecutionTimes.from_samples(size, [seconds] * count)


def at(learner: LatencyLearner, size: int):
    return next(e for e in learner.estimates() if e.batch_size == size)


def test_no_data_means_the_prior_itself():
    learner = LatencyLearner(PRIOR)
    learner.observe(0.0, [])
    assert learner.model() is PRIOR
    assert {e.source for e in learner.estimates()} == {"prior"}
    assert learner.drift(PRIOR).batch_size is None


def test_a_measured_size_blends_with_the_prior_by_its_count():
    learner = LatencyLearner(PRIOR, LearningSettings(prior_batches=20))
    learner.observe(0.0, [batches(4, 0.020, 20)])
    four = at(learner, 4)
    # w = 20 / (20 + 20) = 0.5: halfway between 20 ms measured and 10 ms profiled.
    assert four.mean_s == pytest.approx(0.015)
    assert four.source == "blended" and four.batches == 20
    # Unserved sizes follow the slowdown, exp(20 ln 2 / (20 + 20)) = sqrt(2).
    eight = at(learner, 8)
    assert eight.mean_s == pytest.approx(0.010 * math.sqrt(2))
    assert eight.source == "prior x1.41" and eight.batches == 0
    model = learner.model()
    # The blend says batch 8 (14.1 ms) runs faster than batch 4 (15 ms); the planner's
    # table is the monotone fit: 4 and every larger size pool into their mean weighted by
    # batches + 1 (21 for batch 4, 1 for each size only the prior speaks for).
    larger = [e for e in learner.estimates() if e.batch_size > 4]
    pooled = (21 * 0.015 + sum(e.mean_s for e in larger)) / (21 + len(larger))
    assert model.mean_s(np.array([4.0, 8.0, 64.0])) == pytest.approx([pooled] * 3)
    assert model.mean_s(np.array([1.0, 2.0])) == pytest.approx([0.010 * math.sqrt(2)] * 2)
    assert "learned from 20 batches on linear:10,0" in model.describe()


def test_what_was_measured_fades_with_its_half_life():
    learner = LatencyLearner(PRIOR, LearningSettings(half_life_s=60, prior_batches=20))
    learner.observe(0.0, [batches(2, 0.030, 60)])
    assert at(learner, 2).mean_s == pytest.approx(0.75 * 0.030 + 0.25 * 0.010)
    learner.observe(60.0, [])  # one half-life: 30 batches' weight, same measured mean
    assert at(learner, 2).batches == pytest.approx(30)
    assert at(learner, 2).mean_s == pytest.approx(0.6 * 0.030 + 0.4 * 0.010)


def test_drift_counts_only_sizes_with_enough_batches():
    learner = LatencyLearner(PRIOR, LearningSettings(prior_batches=20, min_batches=30))
    learner.observe(0.0, [batches(4, 0.020, 10)])
    assert learner.drift(PRIOR).batch_size is None  # 10 < 30
    learner.observe(0.0, [batches(4, 0.020, 20)])
    drift = learner.drift(PRIOR)
    # 30 batches: w = 0.6, mean 16 ms, 60% above the planner's 10 ms (and the p99 with
    # it, up to the histogram's 1%: the times do not vary).
    assert drift.batch_size == 4
    assert drift.relative == pytest.approx(0.6, rel=0.03)
    # Against its own table, what is left is the monotone fit's pooling (batch 4 is
    # measured above the sizes the prior speaks for: see the test above).
    assert learner.drift(learner.model()).relative == pytest.approx(0.0, abs=0.05)


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([1, 2, 4, 8, 16, 32]),
        st.lists(st.floats(1e-4, 1.0), min_size=1, max_size=40),
        min_size=1,
    )
)
def test_the_learned_table_is_a_valid_model_between_prior_and_measured(measured):
    learner = LatencyLearner(PRIOR)
    learner.observe(0.0, [ExecutionTimes.from_samples(b, s) for b, s in measured.items()])
    model = learner.model()  # TableLatency validates: p99 >= mean > 0, sizes increasing
    sizes = np.array(model.batch_sizes, dtype=np.float64)
    for column in (model.mean_s(sizes), p99_s(model, sizes)):
        # Physical: a larger batch never takes less time, nor more time per item (up to
        # the table's rounding to the nanosecond).
        assert np.all(np.diff(column) >= -1e-9)
        assert np.all(np.diff(column / sizes) <= 1e-9)
    raw = [e.mean_s for e in learner.estimates()]
    if np.all(np.diff(raw) >= 0) and np.all(np.diff(np.array(raw) / sizes) <= 0):
        # Where the blend is already physical, the table is the blend: between the prior
        # and what was measured.
        for size, samples in measured.items():
            mean = float(model.mean_s(np.array([float(size)]))[0])
            low, high = sorted((float(np.mean(samples)), 0.010))
            assert low * (1 - 1e-9) <= mean <= high * (1 + 1e-9)
    reloaded = json.loads(json.dumps(profile_document(model, [1, 2, 4, 8, 16, 32])))
    assert len(reloaded["points"]) == 6


def test_execution_times_cross_the_wire_and_bad_ones_are_refused():
    stats = WorkerStats(
        "w", 1.0, 3, 3, 0, (), 0.0, ((2, 1), (1, 1)), 0.03, 0, 8, (1, 2), 1,
        execution=(batches(2, 0.02, 1), batches(1, 0.01, 1)),
    )  # fmt: skip
    decoded = decode_stats(encode_stats(stats))
    assert decoded.execution == stats.execution
    pool = observe_pool([decoded, decoded], 1.0, 1.0, 1)
    assert sum(t.batches for t in pool.execution) == 4
    bad = json.loads(encode_stats(stats))
    bad["execution"][0][0] = 0  # padded size 0
    with pytest.raises(MalformedStats, match="execution"):
        decode_stats(json.dumps(bad))
    far = json.loads(encode_stats(stats))
    far["ingress_buckets"] = [[10**6, 1]]  # would index past the histogram
    with pytest.raises(MalformedStats, match="ingress_buckets"):
        decode_stats(json.dumps(far))
    old = json.loads(encode_stats(stats))
    del old["execution"], old["ingress_buckets"]  # an older worker's entry
    assert decode_stats(json.dumps(old)).execution == ()  # the prior stands


def tick(now: float, execution: tuple[ExecutionTimes, ...]) -> PoolStats:
    observation = Observation(now, 1.0, 20, 20, 0, 0, 0.02, 0.03, 2.0, 0.25, 0.3)
    return PoolStats(observation, None, 1, execution)


def test_the_controller_rebuilds_its_table_when_serving_runs_slower_than_planned():
    prior = parse_latency_model("linear:5,1")
    context = PolicyContext(0.1, 1, table=lambda slo: performance_table(prior, 1, slo, False))
    policy = build_policy("predictive:forecaster=holt", context)
    before = policy.optimizer
    compiled = []

    def compile_table(model, workers, slo_s):
        compiled.append(model.describe())
        return performance_table(model, workers, slo_s, False)

    settings = ControllerSettings(
        slo_s=0.1, latency=prior, learning=LearningSettings(min_batches=30, min_interval_s=60)
    )
    controller = Controller(policy, settings, compile_table=compile_table)
    slow = (batches(2, 0.014, 40),)  # twice the planned 7 ms
    first = controller.step(1.0, tick(1.0, slow))
    assert first.replanned is not None and "batch 2 " in first.replanned
    assert policy.optimizer is not before and compiled == [controller.planned_latency.describe()]
    assert controller.replans == 1 and "learned from 40 batches" in compiled[0]
    second = controller.step(2.0, tick(2.0, slow))
    assert second.replanned is None  # once, and not again within the interval
    assert controller.step(70.0, tick(70.0, slow)).replanned is None  # no drift since


def test_the_simulator_reports_no_execution_times_so_it_plans_on_the_prior():
    prior = parse_latency_model("linear:5,1")
    learner = LatencyLearner(prior)
    report = WorkerStats("sim", 1.0, 10, 10, 0, (), 0.0, ((2, 5),), 0.035, 0, 8, None, 1)
    learner.observe(1.0, observe_pool([report], 1.0, 1.0, 1).execution)
    assert learner.model() is prior
