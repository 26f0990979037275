"""Property tests: the compiled engine against the live batcher, and batching invariants."""

import numpy as np
import pytest
from helpers import run_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive.config import BatchConfig
from adaptive.latency import LinearLatency
from simulations import kernel as k
from simulations.engine import Routing
from simulations.reference import replay_reference

LATENCY = LinearLatency(0.004, 0.0005)
TICK_S = 0.05

configs = st.builds(
    BatchConfig,
    max_batch_size=st.integers(1, 6),
    timeout_s=st.sampled_from([0.0, 0.001, 0.005, 0.02, 0.1]),
)


@st.composite
def scenarios(draw):
    gaps = draw(
        st.lists(st.sampled_from([0.0, 0.0005, 0.001, 0.003, 0.01, 0.04]), min_size=1, max_size=60)
    )
    arrivals = np.cumsum(np.array(gaps))
    schedule = draw(st.lists(configs, min_size=1, max_size=8))
    workers = draw(st.integers(1, 3))
    routing = draw(st.sampled_from(list(Routing)))
    max_queue = draw(st.one_of(st.none(), st.integers(1, 8)))
    return arrivals, schedule, workers, routing, max_queue


def _config_for(schedule):
    return lambda tick: schedule[min(tick, len(schedule) - 1)]


def _service(size: int, batch: int) -> float:
    return float(LATENCY.mean_s(np.arange(size + 1))[size])


def _run_engine(scenario) -> np.ndarray:
    arrivals, schedule, workers, routing, max_queue = scenario
    return run_engine(
        arrivals,
        _config_for(schedule),
        latency=LATENCY,
        workers=workers,
        tick_s=TICK_S,
        routing=routing,
        max_queue=max_queue,
    )


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_engine_matches_live_batcher(scenario):
    arrivals, schedule, workers, routing, max_queue = scenario
    fast = _run_engine(scenario)
    slow = replay_reference(
        arrivals.tolist(), _config_for(schedule), TICK_S, workers, _service, routing, max_queue
    )
    slow.sort(key=lambda r: r.request_id)
    assert fast[:, k.REC_ID].tolist() == [r.request_id for r in slow]
    assert [None if np.isnan(d) else d for d in fast[:, k.REC_DISPATCHED_AT]] == [
        r.dispatched_at for r in slow
    ]
    assert fast[:, k.REC_WORKER].tolist() == [r.worker for r in slow]
    assert fast[:, k.REC_BATCH].tolist() == [r.batch for r in slow]


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_batching_invariants(scenario):
    arrivals, schedule, _, routing, max_queue = scenario
    records = _run_engine(scenario)
    # Every request completes or is shed, exactly once.
    assert records[:, k.REC_ID].tolist() == list(range(arrivals.size))
    served = records[~np.isnan(records[:, k.REC_DISPATCHED_AT])]
    if max_queue is None:
        assert served.shape[0] == arrivals.size
    dispatched, completed = served[:, k.REC_DISPATCHED_AT], served[:, k.REC_COMPLETED_AT]
    assert np.all(dispatched >= served[:, k.REC_ARRIVED_AT])
    largest = max(c.max_batch_size for c in schedule)
    for batch in np.unique(served[:, k.REC_BATCH]):
        members = served[served[:, k.REC_BATCH] == batch]
        size = members.shape[0]
        assert size <= largest
        service = _service(size, 0)
        assert np.allclose(
            members[:, k.REC_COMPLETED_AT] - members[:, k.REC_DISPATCHED_AT], service
        )
    assert np.all(completed >= served[:, k.REC_ARRIVED_AT] + _service(1, 0) - 1e-12)
    if routing is Routing.SHARED:
        # FIFO: dispatch order follows arrival order.
        order = np.lexsort((served[:, k.REC_ID], served[:, k.REC_BATCH]))
        assert np.all(np.diff(served[order, k.REC_ID]) > 0)


@settings(max_examples=100, deadline=None)
@given(
    gaps=st.lists(st.sampled_from([0.0, 0.0005, 0.002, 0.01, 0.03]), min_size=1, max_size=50),
    config=configs,
    workers=st.integers(1, 3),
)
def test_no_request_waits_past_its_timeout_while_a_worker_is_idle(gaps, config, workers):
    arrivals = np.cumsum(gaps)
    records = run_engine(
        arrivals, lambda tick: config, latency=LATENCY, workers=workers, tick_s=TICK_S
    )
    batches = np.unique(records[:, k.REC_BATCH])
    for batch in batches:
        members = records[records[:, k.REC_BATCH] == batch]
        dispatched = members[0, k.REC_DISPATCHED_AT]
        oldest = members[:, k.REC_ARRIVED_AT].min()
        if dispatched > oldest + config.timeout_s + 1e-12:
            # It waited longer than its timeout: every worker must have been busy until then.
            earlier = records[records[:, k.REC_DISPATCHED_AT] < dispatched]
            busy_until = np.zeros(workers)
            for row in earlier:
                w = int(row[k.REC_WORKER])
                busy_until[w] = max(busy_until[w], row[k.REC_COMPLETED_AT])
            assert busy_until.min() >= dispatched - 1e-12


def test_engine_histogram_matches_exact_latencies():
    from adaptive.histogram import LatencyHistogram
    from adaptive.policy import StaticPolicy
    from simulations.engine import PoolSettings
    from simulations.run import SimulationSettings, simulate
    from simulations.traces import CountTrace

    settings = SimulationSettings(PoolSettings(3, slo_s=0.02, record_requests=True), seed=1)
    trace = CountTrace("t", 1.0, np.array([800.0, 3000.0, 200.0, 5000.0, 0.0, 900.0]))
    latency = LinearLatency(0.002, 0.0003, sigma=0.2)
    result = simulate(trace, [StaticPolicy(BatchConfig(16, 0.004))], settings, latency).results[0]
    exact = result.records[:, k.REC_COMPLETED_AT] - result.records[:, k.REC_ARRIVED_AT]
    expected = LatencyHistogram.from_samples(exact).summary()
    assert result.latency.count == exact.size == result.completed
    for field in ("p50_s", "p90_s", "p99_s", "p999_s", "max_s", "mean_s"):
        assert getattr(result.latency, field) == pytest.approx(getattr(expected, field), rel=1e-9)
    assert result.within_slo == int((exact <= 0.02).sum())
