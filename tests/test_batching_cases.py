"""Small cases of the batching rule, computed by hand (docs/batching.md)."""

import numpy as np
import pytest
from helpers import run_engine

from adaptive.config import BatchConfig
from adaptive.latency import LinearLatency
from simulations.kernel import REC_BATCH, REC_COMPLETED_AT, REC_DISPATCHED_AT, REC_WORKER
from tidal_base.errors import InvalidInput

# 5 ms + 1 ms per request: a batch of 2 takes 7 ms.
LATENCY = LinearLatency(0.005, 0.001)


def static(max_batch: int, timeout_s: float):
    return lambda tick: BatchConfig(max_batch, timeout_s)


def test_batch_dispatches_when_full_before_timeout():
    records = run_engine(np.array([0.0, 0.001]), static(2, 0.010), latency=LATENCY)
    assert records[:, REC_DISPATCHED_AT].tolist() == [0.001, 0.001]
    assert records[:, REC_COMPLETED_AT] == pytest.approx([0.008, 0.008])


def test_timeout_fires_for_a_lone_request():
    records = run_engine(np.array([0.2]), static(8, 0.010), latency=LATENCY)
    assert records[0, REC_DISPATCHED_AT] == pytest.approx(0.21)
    assert records[0, REC_COMPLETED_AT] == pytest.approx(0.216)


def test_timeout_zero_dispatches_what_is_queued_at_once():
    records = run_engine(np.array([0.1, 0.1, 0.3]), static(8, 0.0), latency=LATENCY)
    assert records[:, REC_DISPATCHED_AT].tolist() == [0.1, 0.1, 0.3]
    assert records[:, REC_BATCH].tolist() == [0, 0, 1]


def test_busy_worker_takes_everything_waiting_when_it_frees():
    # First batch (2) runs 0.001 -> 0.008 on the only worker.
    arrivals = np.array([0.0, 0.001, 0.002, 0.003, 0.0085])
    records = run_engine(arrivals, static(2, 0.010), latency=LATENCY)
    dispatched = records[:, REC_DISPATCHED_AT]
    assert dispatched[:2].tolist() == [0.001, 0.001]
    # Requests 3 and 4 fill a batch of 2 at 0.003, but the only worker is busy until 0.008.
    assert dispatched[2:4] == pytest.approx([0.008, 0.008])
    # Request 5 waits alone for its timeout: 0.0085 + 0.010, the worker being free by then.
    assert dispatched[4] == pytest.approx(0.0185)


def test_overdue_batch_goes_when_worker_frees_with_what_is_queued():
    # Worker busy 0.0 -> 0.025 (batch of 20 at 5 ms + 20 ms); two more arrive and
    # time out (10 ms) while it is busy: they go together the instant it frees.
    arrivals = np.concatenate((np.zeros(20), [0.001, 0.002]))
    records = run_engine(arrivals, static(20, 0.010), latency=LATENCY)
    assert records[20:, REC_DISPATCHED_AT] == pytest.approx([0.025, 0.025])
    assert records[20, REC_BATCH] == records[21, REC_BATCH]


def test_two_workers_share_one_queue():
    arrivals = np.array([0.0, 0.0, 0.001, 0.001])
    records = run_engine(arrivals, static(2, 0.010), latency=LATENCY, workers=2)
    assert records[:, REC_DISPATCHED_AT].tolist() == [0.0, 0.0, 0.001, 0.001]
    assert records[:, REC_WORKER].tolist() == [0, 0, 1, 1]


def test_config_change_applies_at_next_formation_without_touching_the_queue():
    # Tick 0 (0-1 s): max batch 4, timeout 2 s; three requests wait for more.
    # At 1 s the config becomes max batch 2, timeout 2 s: two are due at once, in order.
    arrivals = np.array([0.5, 0.6, 0.7])
    schedule = lambda tick: BatchConfig(4, 2.0) if tick == 0 else BatchConfig(2, 2.0)  # noqa: E731
    records = run_engine(arrivals, schedule, latency=LATENCY)
    assert records[:2, REC_DISPATCHED_AT].tolist() == [1.0, 1.0]
    # The third is now oldest; it waits for its own timeout (0.7 + 2 s).
    assert records[2, REC_DISPATCHED_AT] == pytest.approx(2.7)
    assert records[:, REC_BATCH].tolist() == [0, 0, 1]


def test_shrinking_timeout_releases_an_overdue_request_at_the_tick():
    arrivals = np.array([0.2])
    schedule = lambda tick: BatchConfig(8, 5.0) if tick == 0 else BatchConfig(8, 0.1)  # noqa: E731
    records = run_engine(arrivals, schedule, latency=LATENCY)
    assert records[0, REC_DISPATCHED_AT] == 1.0


def test_bounded_queue_sheds_arrivals_past_the_limit():
    arrivals = np.array([0.0, 0.0001, 0.0002, 0.0003])
    records = run_engine(arrivals, static(1, 0.0), latency=LATENCY, max_queue=1)
    # Request 0 runs at once; request 1 waits (queue 1/1); 2 and 3 find the queue full.
    assert np.isnan(records[2:, REC_DISPATCHED_AT]).all()
    assert records[1, REC_DISPATCHED_AT] == pytest.approx(0.006)


@pytest.mark.parametrize(
    ("max_batch", "timeout", "message"),
    [(0, 0.0, "max_batch_size must be >= 1, got 0"), (4, -1.0, "timeout must be")],
)
def test_batch_config_is_validated(max_batch, timeout, message):
    with pytest.raises(InvalidInput, match=message):
        BatchConfig(max_batch, timeout)
