"""`simulate --prime`: a trace's opening span primes the forecasts, the rest replays."""

import json
from datetime import datetime, timedelta

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulations.cli import main
from simulations.priming import split_history
from simulations.trace_formats import RequestTokens
from simulations.traces import CountTrace, RequestTrace
from tidal_base.errors import InvalidInput

ORIGIN = datetime(2024, 1, 1)


def test_a_count_trace_splits_at_an_interval_edge_into_history_and_the_rest():
    trace = CountTrace("c.csv", 10.0, np.array([10, 20, 30, 40]), ORIGIN, rate_scale=2.0)
    primed = split_history(trace, 20.0)
    assert primed.history.tolist() == pytest.approx([2.0] * 10 + [4.0] * 10)
    assert primed.trace.counts.tolist() == [30, 40]
    assert primed.trace.origin == ORIGIN + timedelta(seconds=20)
    assert primed.trace.rate_scale == 2.0


def test_a_request_trace_splits_into_arrivals_per_second_and_the_rest_from_zero():
    arrivals = np.array([0.2, 0.5, 1.7, 3.0, 3.5])
    tokens = RequestTokens(np.arange(5), np.arange(5) * 10)
    trace = RequestTrace("r.csv", arrivals, ORIGIN, rate_scale=3.0, tokens=tokens)
    primed = split_history(trace, 3.0)
    assert primed.history.tolist() == [6.0, 3.0, 0.0]
    assert primed.trace.arrivals_s.tolist() == [0.0, 0.5]
    assert primed.trace.tokens.input.tolist() == [3, 4]
    assert primed.trace.tokens.output.tolist() == [30, 40]


@pytest.mark.parametrize(
    ("span_s", "message"),
    [
        (0.0, "--prime must be a positive whole number of seconds"),
        (1.5, "--prime must be a positive whole number of seconds"),
        (40.0, "--prime 40s leaves nothing of c.csv to replay (it lasts 40s)"),
        (15.0, "--prime 15s must be a whole number of c.csv's 10s intervals"),
    ],
)
def test_a_span_that_cannot_split_the_trace_is_refused(span_s, message):
    trace = CountTrace("c.csv", 10.0, np.array([10, 20, 30, 40]))
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        split_history(trace, span_s)


@given(
    counts=st.lists(st.integers(0, 10_000), min_size=2, max_size=40),
    step_s=st.sampled_from([1.0, 5.0, 60.0, 1800.0]),
    scale=st.floats(0.1, 100.0),
    data=st.data(),
)
def test_history_and_rest_together_hold_every_expected_request(counts, step_s, scale, data):
    trace = CountTrace("c.csv", step_s, np.array(counts), rate_scale=scale)
    cut = data.draw(st.integers(1, len(counts) - 1))
    primed = split_history(trace, cut * step_s)
    assert primed.history.size == cut * step_s
    assert primed.history.sum() + primed.trace.expected_requests == pytest.approx(
        trace.expected_requests, rel=1e-9, abs=1e-6
    )
    assert (primed.history >= 0).all()


def test_a_primed_replay_forecasts_from_its_first_tick(tmp_path, capsys):
    """Unprimed, a forecasting policy opens on the stand-in (the first tick's rate: no
    history yet); primed with the trace's first hour, on its own model, fitted."""
    path = tmp_path / "counts.csv"
    rows = "".join(f"{i * 60},{60 * (40 + 20 * (i % 3))}\n" for i in range(120))
    path.write_text("timestamp,count\n" + rows)
    argv = ["--trace", str(path), "--workers", "1", "--policy", "predictive", "--no-progress"]
    first = {}
    for name, extra in (("cold", []), ("primed", ["--prime", "1h"])):
        out = tmp_path / name
        assert main([*argv, *extra, "--out", str(out)]) == 0
        summary = json.loads((out / "summary.json").read_text())
        lines = (out / "decisions-predictive.jsonl").read_text().splitlines()
        first[name] = (summary, json.loads(lines[0])["forecast"])
    capsys.readouterr()
    cold, primed = first["cold"][1], first["primed"][1]
    assert cold["model"] == "seasonal-naive" and cold["fallback"] is not None
    assert primed["model"] == "holt" and primed["fallback"] is None
    second_hour = sum(60 * (40 + 20 * (i % 3)) for i in range(60, 120))
    assert first["primed"][0]["requests"] == pytest.approx(second_hour, rel=0.02)
