"""A fleet whose size is a decision: the simulator's replicas, their cost, the baselines.

Exact small cases computed by hand: when a new replica serves, what provisioned time
costs, and how Ray Serve's and Kubernetes' autoscalers move (their documented rules).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptive.autoscalers import HpaPolicy, ServeAutoscalerPolicy
from adaptive.config import BatchConfig
from adaptive.fleet import FleetLimits, FleetView
from adaptive.latency import LinearLatency
from adaptive.policy import Observation, Snapshot
from adaptive.sliding import SlidingMax
from simulations import kernel as k
from simulations.cli import main as simulate
from simulations.engine import PoolSettings, Routing, SimulatedPool
from tidal_base.errors import InvalidInput

CONFIG = BatchConfig(1, 0.0)


def pool(workers: int = 1, startup_s: float = 5.0, warmup_s: float = 0.0) -> SimulatedPool:
    settings = PoolSettings(
        workers,
        slo_s=1.0,
        record_requests=True,
        warmup_s=warmup_s,
        fleet=FleetLimits(1, 4, startup_s),
    )
    # 1 s per request, no jitter: every dispatch instant is computed by hand.
    return SimulatedPool(settings, LinearLatency(1.0, 0.0), np.random.default_rng(0))


def test_a_new_replica_serves_only_once_started_and_is_paid_for_from_the_ask():
    simulated = pool()
    simulated.resize(2, now=0.0)  # ready at 5 s
    assert simulated.fleet(0.0) == FleetView(1, 1, 2, 5.0)
    arrivals = np.repeat(np.arange(8, dtype=np.float64), 2)  # two a second: a queue builds
    for t in range(10):
        simulated.advance(
            float(t), float(t + 1), arrivals[(arrivals >= t) & (arrivals < t + 1)], CONFIG
        )
    records = simulated.records()
    second = records[records[:, k.REC_WORKER] == 1]
    assert second[:, k.REC_DISPATCHED_AT].min() == 5.0  # not a moment before it started
    assert simulated.fleet(5.0) == FleetView(2, 0, 2, 5.0)
    assert simulated.replica_seconds == 20.0  # two replicas for ten 1 s ticks


def test_a_removed_replica_finishes_its_batch_then_takes_no_more():
    simulated = pool(workers=2)
    arrivals = np.array([0.0, 0.0, 0.5, 0.5, 0.5])
    simulated.advance(0.0, 0.5, arrivals[:2], CONFIG)  # both replicas busy until 1.0
    simulated.resize(1, now=0.5)  # the idlest goes: either, both are busy until 1.0
    for t in (0.5, 1.0, 2.0, 3.0, 4.0):
        simulated.advance(
            t, t + (0.5 if t == 0.5 else 1.0), arrivals[2:] if t == 0.5 else arrivals[:0], CONFIG
        )
    records = simulated.records()
    assert len(set(records[records[:, k.REC_DISPATCHED_AT] >= 0.5][:, k.REC_WORKER])) == 1
    # Two replicas for the first half second, one for the rest, plus the half second
    # the removed one spent finishing its batch.
    assert simulated.replica_seconds == pytest.approx(2 * 0.5 + 4.5 * 1 + 0.5)


def test_a_replica_still_starting_is_the_first_to_go():
    simulated = pool()
    simulated.resize(3, now=0.0)
    simulated.resize(2, now=1.0)
    assert simulated.fleet(1.0) == FleetView(1, 1, 2, 5.0)


def test_a_new_replica_warms_its_buckets_before_it_takes_traffic():
    simulated = pool(startup_s=10.0, warmup_s=2.0)
    simulated.advance(0.0, 1.0, np.zeros(0), BatchConfig(8, 0.001))  # warm target 8
    simulated.resize(2, now=1.0)  # start-up 10 s, then buckets 1, 2, 4 and 8 at 2 s each
    assert simulated.fleet(18.9).starting == 1 and simulated.fleet(19.0).ready == 2


def test_a_fleet_that_scales_is_validated_before_anything_runs():
    with pytest.raises(InvalidInput, match="shared queue"):
        PoolSettings(2, 0.1, Routing.ROUND_ROBIN, fleet=FleetLimits(1, 4))
    with pytest.raises(InvalidInput, match=r"within the replica limits \(2-4\)"):
        PoolSettings(1, 0.1, fleet=FleetLimits(2, 4))
    with pytest.raises(InvalidInput, match="max replicas"):
        FleetLimits(3, 2)


def snapshot(now: float, fleet: FleetView, *, queue: int = 0, busy_s: float = 0.0) -> Snapshot:
    observation = Observation(now, 1.0, 0, 0, 0, queue, None, None, 1.0, 1.0, 0.0, busy_s=busy_s)
    return Snapshot(now, observation, CONFIG, 0.1, fleet.ready, fleet=fleet)


def test_serve_autoscaler_moves_up_once_wanted_for_its_delay():
    policy = ServeAutoscalerPolicy(CONFIG, target_ongoing_requests=2.0)
    fleet = FleetView(1, 0, 1)
    answers = [policy.decide(snapshot(t, fleet, queue=10)).replicas for t in range(31)]
    # 10 ongoing for 2 per replica: 5 wanted from the first tick, applied 30 s later.
    assert answers[:30] == [1] * 30 and answers[30] == 5
    decision = policy.decide(snapshot(31, FleetView(1, 4, 5), queue=10))
    assert decision.replicas == 5 and "10.0 ongoing requests" in decision.reason


def test_serve_autoscaler_waits_ten_minutes_to_scale_in_and_a_break_restarts_the_wait():
    policy = ServeAutoscalerPolicy(CONFIG, target_ongoing_requests=2.0, look_back_s=1.0)
    fleet = FleetView(4, 0, 4)
    answers = [policy.decide(snapshot(t, fleet, queue=2)).replicas for t in range(300)]
    policy.decide(snapshot(300, fleet, queue=8))  # a busy second breaks the wait
    answers += [policy.decide(snapshot(t, fleet, queue=2)).replicas for t in range(301, 902)]
    assert set(answers[:-1]) == {4} and answers[-1] == 1  # 600 s after the break


def test_hpa_scales_on_utilisation_each_sync_and_holds_the_window_high_to_scale_in():
    policy = HpaPolicy(CONFIG, target=0.5, period_s=15.0, stabilization_s=300.0)
    fleet = FleetView(2, 0, 2)
    busy = [policy.decide(snapshot(t, fleet, busy_s=1.5)).replicas for t in range(16)]
    # 1.5 busy seconds a second over 2 replicas: 75% against 50%, so ceil(2 x 1.5) = 3,
    # at the first sync, a period after the first tick.
    assert busy[:-1] == [2] * 15 and busy[-1] == 3
    fleet = FleetView(3, 0, 3)
    idle = [policy.decide(snapshot(t, fleet, busy_s=0.3)).replicas for t in range(16, 331)]
    # 10% wants 1 from the sync at 30 s, but the window holds the 3 recommended at 15 s
    # until a sync more than 300 s after it (330 s).
    assert set(idle[:-1]) == {3} and idle[-1] == 1


def test_simulate_scales_a_fleet_and_reports_what_it_paid_for(capsys, tmp_path):
    trace = tmp_path / "step.csv"
    rows = "".join(f"{s},{20 if s < 120 else 3000}\n" for s in range(300))
    trace.write_text("timestamp,count\n" + rows)
    argv = ["--trace", str(trace), "--workers", "1", "--latency-model", "linear:5,0.4"]
    scaling = ["--max-replicas", "8", "--replica-startup", "30s"]
    policies = ["--policy", "serve-autoscaler:max_batch=16,timeout=10ms,target_ongoing=8"]
    fixed = ["--policy", "static:max_batch=16,timeout=10ms"]
    assert simulate([*argv, *scaling, *policies, *fixed, "--json", "--out", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    autoscaled, static = summary["policies"]
    assert autoscaled["max_replicas"] > 1 and autoscaled["replica_changes"] >= 1
    # The fixed replica pays until its queue has drained (the load outran it); the
    # autoscaled fleet paid for more replicas and kept its latency.
    assert static["max_replicas"] == 1 and static["replica_seconds"] > 300
    assert autoscaled["latency_ms"]["p99"] < static["latency_ms"]["p99"]
    decisions = (
        tmp_path / "decisions-serve-autoscaler-max_batch-16-timeout-10ms-target_ongoing-8.jsonl"
    )
    scaled = [json.loads(line) for line in decisions.read_text().splitlines()]
    out = next(d for d in scaled if d["kind"] == "scale_out")
    assert out["replicas"] > out["replicas_before"] and "ongoing requests" in out["reason"]


@pytest.fixture(scope="module")
def joint():
    """The joint policy on one replica's table for linear:5,0.4 (SLO 100 ms), 90 s
    start-up; a fresh policy per test from the same compiled table."""
    from adaptive.specs import PolicyContext, build_policy
    from simulations.calibration import performance_table

    latency = LinearLatency(0.005, 0.0004)

    def table(slo_s: float):
        return performance_table(latency, 1, slo_s, False)

    context = PolicyContext(0.1, 4, table=table, replica_table=table, replica_startup_s=90.0)
    return lambda options="": build_policy(f"predictive:replicas=plan,step=10s{options}", context)


def flat_forecast(now: float, rps: float, rise_at_s: float | None = None, rise_rps: float = 0.0):
    """A forecast in 10 s steps from `now`, flat at `rps`, rising to `rise_rps` from
    `rise_at_s` ahead."""
    from forecaster.forecast import Forecast

    times = now + 10.0 * np.arange(60)
    rate = np.full(60, rps)
    if rise_at_s is not None:
        rate[times - now >= rise_at_s] = rise_rps
    counts = rate * 10.0
    return Forecast(times, 10.0, counts, counts * 0.9, counts * 1.1, 0.9, "test", now)


def planned(policy, now: float, fleet: FleetView, measured_rps: float, forecast):
    observation = Observation(
        now,
        1.0,
        int(measured_rps),
        int(measured_rps),
        0,
        0,
        None,
        None,
        4.0,
        0.5,
        0.3,
        rate_rps=measured_rps,
    )
    snap = Snapshot(
        now,
        observation,
        BatchConfig(8, 0.002),
        0.1,
        fleet.ready,
        fleet=fleet,
        forecast=forecast,
        tick_s=1.0,
    )
    return policy.decide(snap)


def test_the_joint_policy_starts_replicas_ahead_of_a_forecast_rise(joint):
    policy = joint()
    each = policy.replica_rps
    fleet = FleetView(2, 0, 2, 90.0)
    # The lead is the start-up plus a forecast step and two ticks: 102 s. A rise to 4.5
    # replicas' worth 200 s ahead is beyond it; the band's top now (1.1 x one replica's
    # worth) keeps the two there are.
    early = planned(policy, 0.0, fleet, each, flat_forecast(0.0, each, 200.0, 4.5 * each))
    assert early.replicas == 2
    # 100 s ahead it is within the lead: the band's top, 4.95 replicas' worth, needs 5.
    soon = planned(policy, 100.0, fleet, each, flat_forecast(100.0, each, 100.0, 4.5 * each))
    assert soon.replicas == 5
    assert soon.reason.startswith("forecast upper bound") and "starting 3" in soon.reason


def test_a_risk_budget_sizes_for_a_quantile_except_near_events_or_after_a_miss(joint):
    from dataclasses import replace

    policy = joint(",risk=0.2")
    each = policy.replica_rps
    fleet = FleetView(2, 0, 2, 90.0)
    # Mean 4.5 replicas' worth within the lead, band +-10% at level 0.9: the upper bound
    # (4.95) needs 5; the 80% quantile, mean + 0.842/1.645 x 10%, is 4.73: still 5. At a
    # mean of 3.8: the upper bound 4.18 needs 5, the quantile 3.99 needs 4.
    forecast = flat_forecast(0.0, 3.8 * each)
    quantile = planned(policy, 0.0, fleet, each, forecast)
    assert quantile.replicas == 4 and "forecast 80% quantile" in quantile.reason
    # A forecast that touches a declared event is sized for its upper bound.
    sale = replace(flat_forecast(10.0, 3.8 * each), events=("sale",))
    assert planned(joint(",risk=0.2"), 10.0, fleet, each, sale).replicas == 5
    # The load measured outruns the forecast's sizing: the upper bound for a window.
    planned(policy, 20.0, fleet, 6.0 * each, flat_forecast(20.0, 3.8 * each))
    after = planned(policy, 30.0, fleet, each, flat_forecast(30.0, 3.8 * each))
    assert after.replicas == 5 and "forecast upper bound" in after.reason
    # Without a risk budget: the upper bound, as before.
    assert planned(joint(), 0.0, fleet, each, flat_forecast(0.0, 3.8 * each)).replicas == 5


def test_the_joint_policy_never_scales_in_on_a_forecast_alone(joint):
    policy = joint()
    each = policy.replica_rps
    fleet = FleetView(4, 0, 4, 90.0)
    # The forecast says one replica's worth; the pool measures three's.
    for t in range(0, 700, 10):
        decision = planned(policy, float(t), fleet, 2.5 * each, flat_forecast(float(t), 0.2 * each))
        assert decision.replicas >= 3
    # Measured load falls too: a replica goes only once the window has seen no more.
    answers = [
        planned(policy, float(t), fleet, 0.2 * each, flat_forecast(float(t), 0.2 * each)).replicas
        for t in range(700, 1400, 10)
    ]
    assert answers[0] >= 3 and answers[-1] == 1
    first_in = 700 + 10 * next(i for i, r in enumerate(answers) if r < 3)
    assert first_in >= 690 + 600  # the last high measurement, a window later


def test_a_joint_policy_needs_a_fleet_that_can_scale(capsys, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,count\n" + "".join(f"{s},100\n" for s in range(30)))
    assert simulate(["--trace", str(trace), "--policy", "predictive:replicas=plan"]) == 2
    assert "room to scale (--max-replicas)" in capsys.readouterr().err


@given(
    st.lists(st.tuples(st.integers(0, 5), st.floats(-1e6, 1e6)), min_size=1, max_size=60),
    st.integers(1, 30),
)
def test_the_sliding_max_is_the_largest_value_in_the_window(steps, window):
    """Against the scan it replaces: after each sample, the largest value whose time is
    within `window` of the newest."""
    sliding, seen, now = SlidingMax(), [], 0
    for gap, value in steps:
        now += gap
        sliding.push(now, value)
        sliding.expire(now - window)
        seen.append((now, value))
        assert sliding.max() == max(v for t, v in seen if t >= now - window)
