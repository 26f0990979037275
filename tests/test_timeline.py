"""The console's timeline: one row per tick with news, bucketed exactly."""

from __future__ import annotations

from adaptive.config import BatchConfig
from adaptive.decisions import DecisionRecord, Mode
from adaptive.policy import Observation
from server.control.timeline import Timeline


def record(rate: float, p99_s: float | None, cap: int) -> DecisionRecord:
    seen = Observation(0.0, 1.0, int(rate), int(rate), 0, 0, None, p99_s, None, None, 0.0)
    config = BatchConfig(cap, 0.005)
    return DecisionRecord(
        0.0, "p", "static", Mode.ACTIVE, seen, None, None, config, config, config, "", None,
        None, None, (),
    )  # fmt: skip


def test_buckets_average_the_rate_take_the_worst_p99_and_the_last_config():
    timeline = Timeline(capacity=100)
    for second, (rate, p99, cap) in enumerate(
        [(10, 0.010, 8), (20, None, 8), (30, 0.050, 16), (40, 0.020, 16)]
    ):
        timeline.record(1000.0 + second, record(rate, p99, cap), serving_cap=8)
    window = timeline.window(now=1004.0, seconds=60, points=2)
    assert window["rows"] == 4
    columns = window["columns"]
    assert columns["time"] == [1001.0, 1003.0]
    assert columns["rate_rps"] == [15.0, 35.0]
    assert columns["p99_ms"] == [10.0, 50.0]  # the worst in each bucket; None is skipped
    assert columns["max_batch"] == [8, 16]
    assert columns["serving_max_batch"] == [8, 8]
    assert columns["timeout_ms"] == [5.0, 5.0]


def test_the_window_keeps_only_recent_rows_and_the_ring_forgets_the_oldest():
    timeline = Timeline(capacity=3)
    for second in range(5):
        timeline.record(float(second), record(second, None, 4), serving_cap=None)
    assert [row.time for row in timeline.rows] == [2.0, 3.0, 4.0]
    window = timeline.window(now=4.0, seconds=1.5, points=600)
    assert window["columns"]["time"] == [3.0, 4.0]
    assert window["columns"]["p99_ms"] == [None, None]
    assert timeline.window(now=100.0, seconds=10, points=10)["columns"]["time"] == []
