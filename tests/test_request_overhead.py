"""The time outside the batcher: the overhead distribution, the simulator's client
account, the planner charging it, and `simulate` reporting it."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive.config import BatchConfig
from adaptive.latency import LinearLatency, load_latency_table, profile_document
from adaptive.optimizer import ConfigOptimizer
from adaptive.overhead import RequestOverhead, overhead_from_document
from simulations import kernel
from simulations.calibration import performance_table
from simulations.cli import main as simulate_main
from simulations.engine import PoolSettings, SimulatedPool
from tidal_base.errors import InvalidInput

LEVELS = (0.0, 0.5, 0.99, 1.0)


def constant(overhead_s: float) -> RequestOverhead:
    """The same overhead for every request at every rate."""
    return RequestOverhead((1.0,), LEVELS, ((overhead_s,) * len(LEVELS),))


def two_rates() -> RequestOverhead:
    return RequestOverhead(
        (10.0, 110.0), LEVELS, ((0.001, 0.002, 0.004, 0.005), (0.011, 0.012, 0.044, 0.055))
    )


def test_between_measured_rates_the_quantiles_are_interpolated_and_held_beyond():
    overhead = two_rates()
    assert overhead.quantile_s(10.0, 0.5) == pytest.approx(0.002)
    assert overhead.quantile_s(60.0, 0.5) == pytest.approx(0.007)  # halfway
    assert overhead.quantile_s(1.0, 0.99) == pytest.approx(0.004)  # held at the lowest
    assert overhead.quantile_s(1e4, 0.99) == pytest.approx(0.044)  # held at the highest
    grid = overhead.inverse_cdf_s(60.0)
    assert grid[0] == pytest.approx(0.006) and grid[-1] == pytest.approx(0.030)
    assert np.all(np.diff(grid) >= 0)


def test_a_profile_round_trips_its_overhead(tmp_path: Path):
    model = replace(
        load_latency_table(_profile(tmp_path, two_rates().to_document())), source="profile"
    )
    document = profile_document(model, (1, 8, 64))
    again = overhead_from_document(document["request_overhead_ms"], "again")
    assert again == two_rates()


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        ([], "non-empty list"),
        ([{"rate_rps": 5, "levels": [0, 1]}], "request_overhead_ms[0] needs"),
        ([{"rate_rps": 5, "levels": [0.1, 1], "quantiles": [1, 2]}], "from 0 to 1"),
        ([{"rate_rps": 5, "levels": [0, 1], "quantiles": [2, 1]}], "never fall"),
        (
            [
                {"rate_rps": 5, "levels": [0, 1], "quantiles": [1, 2]},
                {"rate_rps": 9, "levels": [0, 0.5, 1], "quantiles": [1, 2, 3]},
            ],
            "same levels",
        ),
    ],
)
def test_a_bad_overhead_is_refused_naming_the_file(tmp_path: Path, entries, says):
    with pytest.raises(InvalidInput, match=r"profile\.json") as error:
        load_latency_table(_profile(tmp_path, entries))
    assert says in str(error.value)


def _profile(tmp_path: Path, overhead: list) -> Path:
    path = tmp_path / "profile.json"
    points = [
        {"batch_size": 1, "mean_ms": 2.0, "p99_ms": 3.0},
        {"batch_size": 64, "mean_ms": 20.0, "p99_ms": 30.0},
    ]
    path.write_text(json.dumps({"points": points, "request_overhead_ms": overhead}))
    return path


def _pool(latency, slo_s: float = 0.05, seed: int = 3) -> SimulatedPool:
    settings = PoolSettings(2, slo_s=slo_s, record_requests=True)
    return SimulatedPool(settings, latency, np.random.default_rng(seed))


@settings(max_examples=40, deadline=None)
@given(
    overhead_ms=st.floats(0.0, 30.0),
    rate=st.floats(50.0, 400.0),
    cap=st.sampled_from([1, 4, 16, 64]),
    timeout_ms=st.floats(0.0, 20.0),
)
def test_with_a_constant_overhead_each_client_latency_is_the_workers_plus_it(
    overhead_ms, rate, cap, timeout_ms
):
    """Exact, request by request: the client account counts within the SLO exactly the
    requests whose worker latency plus the overhead is within it, and the worker's own
    account is the same as without an overhead (the draws come from their own stream)."""
    base = LinearLatency(0.002, 0.0005, sigma=0.2)
    with_overhead = replace(base, overhead=constant(overhead_ms / 1e3))
    arrivals = np.cumsum(np.random.default_rng(1).exponential(1 / rate, 2000))
    config = BatchConfig(cap, timeout_ms / 1e3)
    plain, client = _pool(base), _pool(with_overhead)
    plain_stats = plain.advance(0.0, math.inf, arrivals, config)
    stats = client.advance(0.0, math.inf, arrivals, config)
    assert plain_stats.within_slo == stats.within_slo
    columns = [c for c in range(kernel.NUM_REC_COLUMNS) if c != kernel.REC_OVERHEAD]
    assert np.array_equal(plain.records()[:, columns], client.records()[:, columns])
    records = client.records()
    latency = records[:, kernel.REC_COMPLETED_AT] - records[:, kernel.REC_ARRIVED_AT]
    assert np.all(records[:, kernel.REC_OVERHEAD] == overhead_ms / 1e3)
    assert stats.client_within_slo == int(np.sum(latency + overhead_ms / 1e3 <= 0.05))
    assert stats.client_latency_sum_s == pytest.approx(
        stats.latency_sum_s + stats.completed * overhead_ms / 1e3
    )
    assert client.client_histogram.sum() == stats.completed


@pytest.mark.parametrize(("pool_rate", "expected_ms"), [(20.0, 1.0), (120.0, 6.5), (220.0, 12.0)])
def test_draws_are_taken_at_each_workers_share_of_the_rate(pool_rate, expected_ms):
    """Two ready workers share the pool's rate: at 220 req/s each sees 110, the higher
    measured rate (12 ms everywhere); at 120, 60 each, halfway (6.5 ms); at 20, the lower
    rate's 1 ms is held below it."""
    overhead = RequestOverhead((10.0, 110.0), LEVELS, ((0.001,) * 4, (0.012,) * 4))
    latency = LinearLatency(0.002, 0.0005, overhead=overhead)
    arrivals = np.cumsum(np.random.default_rng(2).exponential(1 / pool_rate, 5000))
    pool = _pool(latency, slo_s=1.0)
    stats = pool.advance(0.0, math.inf, arrivals, BatchConfig(1, 0.0), rate_rps=pool_rate)
    extra_s = (stats.client_latency_sum_s - stats.latency_sum_s) / stats.completed
    assert extra_s == pytest.approx(expected_ms / 1e3, rel=0.01)


def test_the_plan_charges_the_overhead_against_the_slo():
    """With 60 ms of the 100 ms SLO spent outside the batcher, the planner no longer
    takes the long timeout it takes without: what it picks leaves room for the overhead."""
    base = LinearLatency(0.002, 0.0004)
    charged = replace(base, overhead=constant(0.060))
    rate = 200.0
    plain = ConfigOptimizer(performance_table(base, 1, 0.1, padded=False), 0.1)
    with_overhead = ConfigOptimizer(performance_table(charged, 1, 0.1, padded=False), 0.1)
    before, after = plain.choose(rate), with_overhead.choose(rate)
    assert before.meets_slo and after.meets_slo
    assert after.config.timeout_s < before.config.timeout_s
    assert after.chosen.predicted_p99_s <= 0.08
    # Its prediction is the client's: the batcher's own p99 plus the overhead.
    batcher_p99_s = plain.predict(after.config, rate).predicted_p99_s
    assert after.chosen.predicted_p99_s == pytest.approx(batcher_p99_s + 0.060, rel=0.05)
    assert "client latency" in with_overhead.table.description


def test_simulate_reports_what_clients_see_only_when_the_profile_measured_it(
    tmp_path: Path, capsys
):
    trace = tmp_path / "trace.csv"
    trace.write_text("timestamp,count\n" + "".join(f"{t},{40 + t % 7}\n" for t in range(120)))
    profile = str(_profile(tmp_path, constant(0.03).to_document()))
    args = ["--trace", str(trace), "--policy", "static:max_batch=8,timeout=5ms"]

    def run(*extra: str) -> str:
        assert simulate_main([*args, *extra]) == 0
        return capsys.readouterr().out

    summary = json.loads(run("--latency-model", profile, "--json"))
    assert summary["client_overhead"].startswith("overhead outside the batcher: p99 30.0 ms")
    policy = summary["policies"][0]
    assert policy["client_latency_ms"]["p50"] == pytest.approx(
        policy["latency_ms"]["p50"] + 30.0, rel=0.02
    )
    assert 0 <= policy["client_slo_attainment"] <= policy["slo_attainment"]
    table = run("--latency-model", profile)
    assert "client p99" in table and "client SLO %" in table
    plain_summary = json.loads(run("--latency-model", "linear:2,0.5", "--json"))
    plain = plain_summary["policies"][0]
    assert "client_latency_ms" not in plain and "client_slo_attainment" not in plain
    assert "client_overhead" not in plain_summary
    assert "client p99" not in run()


def test_a_model_learned_from_serving_keeps_the_profiles_overhead():
    """Serving teaches the batch times, not the time outside the batcher: a rebuilt plan
    still charges what the profile under load measured."""
    from adaptive.learned_latency import ExecutionTimes, LatencyLearner

    prior = replace(LinearLatency(0.002, 0.0005), overhead=two_rates())
    learner = LatencyLearner(prior)
    learner.observe(1.0, [ExecutionTimes.from_samples(8, [0.009] * 50)])
    assert learner.model().overhead == two_rates()
