"""Declared events: every number finite and in range, refused in one line naming the event
and the field, whether it comes as a value, an API document or a file."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from forecaster.events import (
    Event,
    apply_events,
    event_to_dict,
    events_from_document,
    load_events,
    remove_events,
    rescale_events,
)
from forecaster.forecast import Forecast
from tidal_base.errors import InvalidInput

NAN, INF = math.nan, math.inf
SALE = {"name": "sale", "start": 1000, "end": 2800, "multiplier": 5.0, "ramp_up": 60}


def sale(**fields) -> Event:
    values = {"name": "sale", "start_s": 1000.0, "end_s": 2800.0, "multiplier": 5.0}
    return Event(**{**values, **fields})


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
@pytest.mark.parametrize(
    ("field", "name"),
    [
        ("start_s", "start"),
        ("end_s", "end"),
        ("multiplier", "multiplier"),
        ("ramp_up_s", "ramp_up"),
        ("ramp_down_s", "ramp_down"),
    ],
)
def test_an_event_refuses_non_finite_numbers_by_field(field, name, bad):
    with pytest.raises(InvalidInput, match=rf"^event 'sale': {name} must be .*, got -?(nan|inf)$"):
        sale(**{field: bad})


@pytest.mark.parametrize("bad", [NAN, INF, -INF, -1.0, 2e9])
def test_an_absolute_rate_must_be_finite_and_in_range(bad):
    with pytest.raises(InvalidInput, match=r"^event 'sale': rate_rps must be in \[0, 1e\+09\]"):
        sale(multiplier=None, rate_rps=bad)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"multiplier": 0.0}, "multiplier must be in [0.001, 1000], got 0.0"),
        ({"multiplier": -2.0}, "multiplier must be in [0.001, 1000], got -2.0"),
        ({"multiplier": 1e4}, "multiplier must be in [0.001, 1000], got 10000.0"),
        ({"multiplier": True}, "multiplier must be in [0.001, 1000], got True"),
        ({"ramp_up_s": -1.0}, "ramp_up must be seconds in [0, 2e+12], got -1.0"),
        (
            {"start_s": 1e13},
            "start must be Unix seconds within [-1e+12, 1e+12], got 10000000000000.0",
        ),
        ({"multiplier": 2.0, "rate_rps": 10.0}, "give exactly one of multiplier or rate_rps"),
        ({"end_s": 1000.0}, "end must be after start"),
        (
            {"ramp_up_s": 1000.0, "ramp_down_s": 900.0},
            "ramp_up + ramp_down exceed the event's duration",
        ),
    ],
)
def test_out_of_range_values_are_refused(fields, message):
    with pytest.raises(InvalidInput) as refused:
        sale(**fields)
    assert str(refused.value) == f"event 'sale': {message}"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("multiplier", NAN, "multiplier must be in [0.001, 1000], got nan"),
        ("multiplier", INF, "multiplier must be in [0.001, 1000], got inf"),
        ("start", NAN, "start must be Unix seconds within [-1e+12, 1e+12], got nan"),
        ("end", -INF, "end must be Unix seconds within [-1e+12, 1e+12], got -inf"),
    ],
)
def test_a_json_document_with_nan_or_infinity_is_refused_in_one_line(field, value, message):
    # Python's json reads NaN and Infinity: an API body or a stored copy can carry them.
    body = json.loads(json.dumps({"events": [{**SALE, field: value}]}))
    with pytest.raises(InvalidInput) as refused:
        events_from_document(body, "events")
    assert str(refused.value) == f"events: event 1: event 'sale': {message}"


def test_a_json_rate_of_infinity_is_refused():
    body = json.loads('[{"name": "x", "start": 0, "end": 10, "rate_rps": Infinity}]')
    with pytest.raises(InvalidInput, match=r"^api: event 1: event 'x': rate_rps must be in"):
        events_from_document(body, "api")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"start": True}, "event 1 start: not an ISO-8601 time or Unix seconds: True"),
        ({"multiplier": False}, "event 1 multiplier: expected a number, got False"),
        ({"ramp_up": True}, "event 1 ramp_up must be a duration such as 10ms"),
        ({"ramp_up": NAN}, "event 1 ramp_up must be a finite value >= 0, got nan"),
        ({"rate_rps": 100.0}, "give exactly one of multiplier or rate_rps"),
    ],
)
def test_document_fields_that_are_not_numbers_are_refused(entry, message):
    with pytest.raises(InvalidInput, match=r"^doc: ") as refused:
        events_from_document([{**SALE, **entry}], "doc")
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".json", '{"events": [{"name": "a", "start": 0, "end": 10, "multiplier": NaN}]}'),
        (".yaml", "events:\n  - {name: a, start: 0, end: 10, multiplier: .nan}\n"),
        (".yaml", "events:\n  - {name: a, start: 0, end: .inf, multiplier: 2}\n"),
    ],
)
def test_an_events_file_with_nan_or_infinity_names_the_file_event_and_field(tmp_path, suffix, text):
    path = tmp_path / f"events{suffix}"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=rf"^{path}: event 1: event 'a': (multiplier|end) "):
        load_events(path)


def test_events_file_errors_name_the_event(tmp_path):
    path = tmp_path / "events.yaml"
    path.write_text("events:\n  - name: a\n    start: 2026-01-01T00:00:00\n")
    with pytest.raises(InvalidInput, match="event 1: missing field 'end'"):
        load_events(path)
    path.write_text("events:\n  - {name: a, start: 0, end: 10, multiplier: -2}\n")
    with pytest.raises(InvalidInput, match="event 'a': multiplier must be in"):
        load_events(path)


def test_an_unknown_key_is_refused_naming_the_key_the_file_and_the_known_keys(tmp_path):
    path = tmp_path / "events.yaml"
    path.write_text(
        "events:\n  - {name: a, start: 0, end: 600, multiplier: 2}\n"
        "  - {name: b, start: 0, end: 600, multiplier: 2, ramp_upp: 90s}\n"
    )
    with pytest.raises(InvalidInput) as refused:
        load_events(path)
    assert str(refused.value) == (
        f"{path}: event 2: unknown key 'ramp_upp' (known: name, start, end, multiplier, "
        "rate_rps, ramp_up, ramp_down, peak_rps)"
    )


def test_the_generated_example_events_load_with_their_notes():
    """`tidal trace promo-day` writes each sale's expected peak_rps, a note for people."""
    events = load_events(Path(__file__).resolve().parent.parent / "examples/promo_day.events.yaml")
    assert len(events) >= 3 and all(e.multiplier for e in events)


SPECIAL = [NAN, INF, -INF, -1.0, 0.0, 1e-4, 1e-3, 1e3, 1e9, 2e9, 1e13]


def wild(low: float, high: float) -> st.SearchStrategy[float]:
    """Mostly numbers that fit the forecast below, often the edge cases."""
    return st.one_of(st.sampled_from(SPECIAL), st.floats(low, high))


def flat_forecast(steps: int = 40, step_s: float = 100.0, count: float = 1e6) -> Forecast:
    times = np.arange(steps) * step_s
    mean = np.full(steps, count)
    return Forecast(times, step_s, mean, 0.8 * mean, 1.2 * mean, 0.9, "flat", 0.0)


@given(
    wild(0.0, 3000.0),
    wild(1.0, 3000.0),
    wild(0.0, 20.0),
    wild(0.0, 500.0),
    wild(0.0, 500.0),
    st.booleans(),
)
def test_any_event_that_exists_keeps_the_forecast_finite(start, length, value, up, down, rate):
    """Each number is refused by name, or the event's forecast is finite everywhere."""
    lift = {"rate_rps": value} if rate else {"multiplier": value}
    try:
        event = Event("e", start, start + length, ramp_up_s=up, ramp_down_s=down, **lift)
    except InvalidInput as refused:
        assert str(refused).startswith("event 'e': ") and "\n" not in str(refused)
        return
    forecast = apply_events(flat_forecast(), (event,))
    for band in (forecast.mean, forecast.lower, forecast.upper):
        assert np.all(np.isfinite(band))
    usual = remove_events(np.full(40, 1e6), np.arange(40) * 100.0 + 50.0, (event,))
    assert np.all(np.isfinite(usual) | (np.isnan(usual) & rate))


@given(
    st.floats(-1e9, 1e9),
    st.floats(1.0, 1e6),
    st.one_of(st.floats(1e-3, 1e3), st.none()),
    st.floats(0.0, 1e9),
    st.floats(0.0, 0.4),
)
def test_event_documents_round_trip(start, length, multiplier, rate, ramp_fraction):
    lift = {"multiplier": multiplier} if multiplier is not None else {"rate_rps": rate}
    ramp = length * ramp_fraction
    event = Event("e", start, start + length, ramp_up_s=ramp, ramp_down_s=ramp, **lift)
    assert events_from_document([event_to_dict(event)], "doc") == (event,)
    assert events_from_document(json.loads(json.dumps([event_to_dict(event)])), "d") == (event,)


def test_rescaled_events_stay_valid():
    (event,) = rescale_events((sale(ramp_up_s=60.0),), origin_s=0.0, time_scale=60.0)
    assert (event.start_s, event.end_s, event.ramp_up_s) == pytest.approx((1000 / 60, 2800 / 60, 1))
