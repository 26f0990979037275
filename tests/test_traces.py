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


# -- the field's formats: each written small here, read by its shape ---------------------


def test_the_azure_llm_traces_keep_their_token_counts_in_arrival_order(tmp_path):
    text = (
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2024-05-10 00:00:02.000,900,20\n"
        "2024-05-10 00:00:01.000,374,44\n"
        "2024-05-10 00:00:03.500,396,109\n"
    )
    trace = load_trace(write(tmp_path, text))
    assert trace.arrivals_s.tolist() == [0.0, 1.0, 2.5]
    assert trace.tokens.input.tolist() == [374, 900, 396]  # sorted with their arrivals
    assert trace.tokens.output.tolist() == [44, 20, 109]


def test_burstgpt_reads_as_requests_with_seconds_from_the_start(tmp_path):
    text = (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n"
    )
    trace = load_trace(write(tmp_path, text, "BurstGPT_1.csv"))
    assert isinstance(trace, RequestTrace)
    assert trace.arrivals_s.tolist() == [0.0, 40.0, 113.0] and trace.origin is None
    assert trace.tokens.input.tolist() == [472, 1087, 417]
    assert trace.tokens.output.tolist() == [18, 0, 276]


def test_a_token_count_that_does_not_parse_is_named_by_line(tmp_path):
    text = "Timestamp,Model,Request tokens,Response tokens\n1,a,10,5\n2,a,ten,5\n"
    with pytest.raises(TraceError, match=r"trace.csv:3: 'Request tokens' must be a token count"):
        load_trace(write(tmp_path, text))


def test_mooncake_json_lines_are_requests_in_milliseconds(tmp_path):
    lines = [
        '{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [0, 1]}',
        "",
        '{"timestamp": 1500, "input_length": 6472, "output_length": 26, "hash_ids": [2]}',
        '{"timestamp": 750, "input_length": 100, "output_length": 3, "hash_ids": []}',
    ]
    trace = load_trace(write(tmp_path, "\n".join(lines) + "\n", "mooncake_trace.jsonl"))
    assert trace.arrivals_s.tolist() == [0.0, 0.75, 1.5]
    assert trace.tokens.input.tolist() == [6955, 100, 6472]
    assert "not sorted" in trace.notes[0]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"timestamp": 1, "prompt": "hi"}', r"t.jsonl:2: unknown key 'prompt' \(known: "),
        ('{"input_length": 5}', r"t.jsonl:2: no 'timestamp' \(milliseconds\)"),
        ('{"timestamp": -4}', r"t.jsonl:2: 'timestamp' must be a number >= 0, got -4"),
        ('{"timestamp": 5', r"t.jsonl:2: not a JSON object"),
        ("[1, 2]", r"t.jsonl:2: expected a JSON object, got list"),
    ],
)
def test_a_bad_mooncake_line_is_named(tmp_path, line, message):
    path = write(tmp_path, '{"timestamp": 0}\n' + line + "\n", "t.jsonl")
    with pytest.raises(TraceError, match=message):
        load_trace(path)


def functions_day(tmp_path: Path, rows: list[tuple[str, list[int]]]) -> Path:
    """An Azure Functions 2019 day: per-minute counts for each (HashFunction, counts)."""
    header = "HashOwner,HashApp,HashFunction,Trigger," + ",".join(str(m) for m in range(1, 1441))
    lines = [header]
    for function, counts in rows:
        minutes = (counts + [0] * 1440)[:1440]
        lines.append(f"o1,a1,{function},http," + ",".join(map(str, minutes)))
    return write(tmp_path, "\n".join(lines) + "\n", "invocations_per_function_md.anon.d01.csv")


def test_azure_functions_replays_one_function_or_their_sum(tmp_path):
    path = functions_day(tmp_path, [("f1", [60, 120]), ("f2", [0, 30, 90]), ("f1", [6])])
    summed = load_trace(path)
    assert isinstance(summed, CountTrace) and summed.step_s == 60.0
    assert summed.counts[:4].tolist() == [66, 150, 90, 0] and summed.counts.size == 1440
    assert "all 3 functions" in summed.name
    one = load_trace(path, function="f1")  # one function on two triggers: both rows
    assert one.counts[:3].tolist() == [66, 120, 0] and "function f1" in one.name
    with pytest.raises(TraceError, match="no function 'nope' among its 3"):
        load_trace(path, function="nope")
    with pytest.raises(TraceError, match="'requests' was forced, but this is Azure Functions"):
        load_trace(path, TraceFormat.REQUESTS)


def test_a_function_chosen_for_another_kind_of_trace_is_refused(tmp_path):
    with pytest.raises(TraceError, match="not an Azure Functions trace"):
        load_trace(write(tmp_path, "timestamp,count\n0,5\n1,6\n"), function="f1")


def test_a_negative_invocation_count_is_named_by_line_and_minute(tmp_path):
    path = functions_day(tmp_path, [("f1", [1, 2]), ("f2", [3, -1])])
    with pytest.raises(TraceError, match=r"d01.csv:3: minute '2' must be a count >= 0, got -1"):
        load_trace(path)


def test_simulate_and_the_backtest_replay_one_function(tmp_path, capsys):
    import json

    from server.cli import main as tidal
    from simulations.cli import main as simulate

    busy = [600 + (m % 60) * 10 for m in range(1440)]
    path = functions_day(tmp_path, [("f1", busy), ("f2", [5] * 1440)])
    argv = ["--trace", str(path), "--function", "f1", "--latency-model", "linear:5,0.4"]
    assert simulate([*argv, "--time-scale", "60", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests"] == pytest.approx(sum(busy), rel=0.01)
    backtest = ["forecast", "backtest", "--trace", str(path), "--function", "f2", "--json"]
    assert tidal([*backtest, "--model", "holt", "--horizon", "5m", "--initial", "6h"]) == 0
    assert json.loads(capsys.readouterr().out)["trace"].endswith("(function f2)")
