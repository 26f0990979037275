from pathlib import Path

import numpy as np
import pytest

from simulations.arrivals import ArrivalStream
from simulations.errors import TraceError
from simulations.traces import CountTrace, RequestTrace, TraceFormat, load_trace


def write(tmp_path: Path, text: str, name: str = "trace.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_request_trace_with_float_seconds(tmp_path):
    trace = load_trace(write(tmp_path, "timestamp,tokens\n10.0,5\n10.5,7\n12.0,1\n"))
    assert isinstance(trace, RequestTrace)
    assert trace.arrivals_s.tolist() == [0.0, 0.5, 2.0]
    assert trace.origin is None


def test_request_trace_with_iso_timestamps_like_the_azure_trace(tmp_path):
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    trace = load_trace(write(tmp_path, text))
    assert trace.arrivals_s[1] == pytest.approx(4.314579)
    assert trace.origin.isoformat() == "2023-11-16T18:15:46.680590"


def test_unsorted_request_timestamps_are_sorted_with_a_note(tmp_path):
    trace = load_trace(write(tmp_path, "time\n3\n1\n2\n"))
    assert trace.arrivals_s.tolist() == [0.0, 1.0, 2.0]
    assert "not sorted" in trace.notes[0]


def test_count_trace_is_detected_and_gaps_are_zero_filled(tmp_path):
    trace = load_trace(write(tmp_path, "timestamp,count\n0,10\n60,20\n180,5\n"))
    assert isinstance(trace, CountTrace)
    assert trace.step_s == 60
    assert trace.counts.tolist() == [10, 20, 0, 5]
    assert "1 missing intervals" in trace.notes[0]


def test_rate_column_is_requests_per_second(tmp_path):
    trace = load_trace(write(tmp_path, "timestamp,rate\n0,2.5\n10,1\n"))
    assert trace.counts.tolist() == [25.0, 10.0]


def test_format_can_be_forced_and_a_contradiction_is_said(tmp_path):
    path = write(tmp_path, "timestamp,tokens\n0,10\n1,20\n")
    trace = load_trace(path, TraceFormat.REQUESTS)
    assert isinstance(trace, RequestTrace) and trace.arrivals_s.size == 2
    counted = write(tmp_path, "timestamp,count\n0,10\n1,20\n")
    # One request per row would replay 2 requests of 30: refused, saying why.
    with pytest.raises(TraceError, match="'count' column: this is a count-level trace"):
        load_trace(counted, TraceFormat.REQUESTS)


def test_time_and_rate_scale(tmp_path):
    path = write(tmp_path, "timestamp,count\n0,100\n10,100\n")
    trace = load_trace(path, time_scale=10, rate_scale=2)
    assert trace.step_s == 1.0 and trace.duration_s == 2.0
    assert trace.expected_requests == 400


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty trace"),
        ("timestamp,count\n", "a header but no rows"),
        ("timestamp,count\n0,10\n1,ten\n", r"trace.csv:3: cannot parse 'count' .* '1,ten'"),
        ("timestamp,count\n0,10\n1,-4\n", r"trace.csv:3: negative 'count' \(-4\)"),
        ("timestamp,count\n0,10\n1,5\n0,7\n", r"trace.csv:4: duplicate interval .* line 2"),
        ("timestamp\n2024-01-01T00:00:00\nyesterday\n", r"trace.csv:3: cannot parse 'timestamp'"),
        # Ragged rows: more fields than the header, also in the first column's place.
        ("timestamp,count\n0,5\n1,6,7\n", r"trace.csv:3: 3 fields, but the header has 2"),
        ("timestamp\n2024-01-01 00:00:00,3\n", r"trace.csv:2: 2 fields, but the header has 1"),
        ("foo,bar\n1,2\n3,4\n", r"no timestamp column in the header \(foo, bar\)"),
        ("timestamp\n2024-01-01 00:00:00\n", r"1 request\(s\), all at one instant"),
        ("t\n5\n5\n", r"2 request\(s\), all at one instant"),
    ],
)
def test_bad_traces_name_the_file_and_line(tmp_path, text, message):
    with pytest.raises(TraceError, match=message):
        load_trace(write(tmp_path, text))


def test_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace(tmp_path / "nope.csv")


def test_poisson_arrivals_follow_the_counts_and_stream_in_order():
    counts = np.array([1000.0, 0.0, 3000.0] * 20)
    trace = CountTrace("c", 1.0, counts)
    stream = ArrivalStream(trace.arrival_chunks(7.0, np.random.default_rng(1)))
    taken = [stream.take_until(t) for t in np.arange(0.5, 61, 0.5)]
    everything = np.concatenate(taken)
    assert stream.drained
    assert np.all(np.diff(everything) >= 0)
    per_second = np.bincount(everything.astype(int), minlength=60)
    assert per_second[1::3].sum() == 0  # the empty intervals stay empty
    assert everything.size == pytest.approx(counts.sum(), rel=0.02)
    assert per_second[2::3].mean() == pytest.approx(3000, rel=0.03)


def test_request_rate_scale_thins_and_multiplies():
    arrivals = np.sort(np.random.default_rng(0).uniform(0, 100, 20_000))
    for scale in (0.5, 2.5):
        trace = RequestTrace("r", arrivals, rate_scale=scale)
        chunks = [a for _, a in trace.arrival_chunks(10.0, np.random.default_rng(2))]
        combined = np.concatenate(chunks)
        assert np.all(np.diff(combined) >= 0)
        assert combined.size == pytest.approx(20_000 * scale, rel=0.03)
