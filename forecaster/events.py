"""Operator-declared traffic events: known spikes folded into the statistical forecast.

Operators know their calendar (a flash sale at 20:00). An `Event` scales the forecast by
its multiplier (or replaces it with an absolute rate) over its window, ramping up and
down linearly, and widens the band for the uncertainty of that multiplier. Observations
inside an event are divided by its multiplier before the model sees them, so the model
keeps learning the usual level and never takes the spike for a new normal.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import numpy as np
import yaml

from forecaster.forecast import Forecast
from forecaster.models import Forecaster, StepClock
from forecaster.series import RateSeries, epoch_seconds
from tidal_base.errors import InvalidInput
from tidal_base.units import parse_duration_s

EVENT_UNCERTAINTY = 0.3
"""Relative uncertainty of an event's lift: the band spans +-30% of (multiplier - 1)."""

MULTIPLIER_RANGE = (1e-3, 1e3)
"""An event's multiplier lies in this range: observations are divided by the lift, so a
lift near 0 (or a huge one) would overflow the model's inputs (or the forecast)."""
MAX_RATE_RPS = 1e9
"""The largest absolute rate an event may declare (requests per second)."""
MAX_TIME_S = 1e12
"""Event times lie within +-1e12 s (some 31,000 years) of the clock's zero."""


@dataclass(frozen=True)
class Event:
    """A declared event; times in the series' clock (Unix seconds for dated traces).

    Every number is finite and in range (`MAX_TIME_S`, `MULTIPLIER_RANGE`, `MAX_RATE_RPS`;
    ramps >= 0), checked here so that no path (a file, an API body, a stored copy) can
    hand the forecast a NaN."""

    name: str
    start_s: float
    end_s: float
    multiplier: float | None = None
    rate_rps: float | None = None
    ramp_up_s: float = 0.0
    ramp_down_s: float = 0.0

    def __post_init__(self) -> None:
        # Every number is checked before any is used: a NaN compares false with
        # everything, so it would pass "end after start" and poison every forecast.
        where = f"event {self.name!r}"
        for field, value in (("start", self.start_s), ("end", self.end_s)):
            _check_in(where, field, value, -MAX_TIME_S, MAX_TIME_S, "Unix seconds within")
        for field, value in (("ramp_up", self.ramp_up_s), ("ramp_down", self.ramp_down_s)):
            _check_in(where, field, value, 0.0, 2 * MAX_TIME_S, "seconds in")
        if (self.multiplier is None) == (self.rate_rps is None):
            raise InvalidInput(f"{where}: give exactly one of multiplier or rate_rps")
        if self.multiplier is not None:
            _check_in(where, "multiplier", self.multiplier, *MULTIPLIER_RANGE, "in")
        if self.rate_rps is not None:
            _check_in(where, "rate_rps", self.rate_rps, 0.0, MAX_RATE_RPS, "in")
        if self.end_s <= self.start_s:
            raise InvalidInput(f"{where}: end must be after start")
        if self.ramp_up_s + self.ramp_down_s > self.end_s - self.start_s:
            raise InvalidInput(f"{where}: ramp_up + ramp_down exceed the event's duration")

    def weight(self, times_s: np.ndarray) -> np.ndarray:
        """0 outside the event, 1 at full strength, linear on the ramps."""
        up = np.clip((times_s - self.start_s) / max(self.ramp_up_s, 1e-9), 0.0, 1.0)
        down = np.clip((self.end_s - times_s) / max(self.ramp_down_s, 1e-9), 0.0, 1.0)
        inside = (times_s >= self.start_s) & (times_s < self.end_s)
        return np.where(inside, np.minimum(up, down), 0.0)


def _check_in(where: str, field: str, value: object, low: float, high: float, what: str) -> None:
    """`value` is a real number (not a bool) in [low, high], else one line naming it."""
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not low <= value <= high:
        raise InvalidInput(f"{where}: {field} must be {what} [{low:g}, {high:g}], got {value!r}")


def _touching(events: tuple[Event, ...], times_s: np.ndarray) -> tuple[Event, ...]:
    """The events that overlap `times_s` at all: the others weigh 0 everywhere there
    (a forecast a few minutes long meets one of a day's events now and then)."""
    if not times_s.size:
        return ()
    first, last = float(times_s.min()), float(times_s.max())
    return tuple(e for e in events if e.start_s <= last and e.end_s > first)


def multiplier_at(events: tuple[Event, ...], times_s: np.ndarray) -> np.ndarray:
    """The combined multiplicative lift of the multiplier events (1 where none applies)."""
    lift = np.ones_like(times_s, dtype=np.float64)
    for event in _touching(events, times_s):
        if event.multiplier is not None:
            lift *= 1.0 + (event.multiplier - 1.0) * event.weight(times_s)
    return lift


def apply_events(forecast: Forecast, events: tuple[Event, ...]) -> Forecast:
    """Scale (or replace) the forecast inside declared events and widen its band there."""
    times = forecast.times_s + forecast.step_s / 2
    events = _touching(events, times)
    lift = multiplier_at(events, times)
    extra = np.abs(lift - 1.0) * EVENT_UNCERTAINTY
    mean, lower, upper = (
        forecast.mean * lift,
        forecast.lower * (lift - extra),
        forecast.upper * (lift + extra),
    )
    active = [e.name for e in events if np.any(e.weight(times) > 0)]
    for event in events:
        if event.rate_rps is None:
            continue
        w = event.weight(times)
        target = event.rate_rps * forecast.step_s
        mean = (1 - w) * mean + w * target
        lower = (1 - w) * lower + w * target * (1 - EVENT_UNCERTAINTY)
        upper = (1 - w) * upper + w * target * (1 + EVENT_UNCERTAINTY)
    return Forecast(
        forecast.times_s,
        forecast.step_s,
        mean,
        lower,
        upper,
        forecast.level,
        forecast.model,
        forecast.fitted_at_s,
        forecast.fallback,
        tuple(active),
    ).clipped()


def remove_events(values: np.ndarray, times_s: np.ndarray, events: tuple[Event, ...]) -> np.ndarray:
    """Observations as they would have been without the events (NaN under a fixed rate)."""
    usual = values / multiplier_at(events, times_s)
    for event in events:
        if event.rate_rps is not None:
            usual[event.weight(times_s) > 0] = np.nan
    return usual


@dataclass(frozen=True)
class EventAware:
    """Wraps any forecaster with declared events."""

    inner: Forecaster
    events: tuple[Event, ...]

    @property
    def name(self) -> str:
        return self.inner.name

    def fit(self, series: RateSeries) -> FittedEventAware:
        times = series.times_s() + series.step_s / 2
        cleaned = RateSeries(
            series.start_s, series.step_s, remove_events(series.counts, times, self.events)
        )
        end = series.start_s + len(series) * series.step_s
        return FittedEventAware(
            self.inner.fit(cleaned), self.events, StepClock(end, series.step_s, end)
        )


@dataclass
class FittedEventAware:
    inner: object
    events: tuple[Event, ...]
    clock: StepClock

    @property
    def name(self) -> str:
        return self.inner.name

    def update(self, values: np.ndarray) -> None:
        times = self.clock.ahead(len(values)) + self.clock.step_s / 2
        self.inner.update(remove_events(np.asarray(values, dtype=np.float64), times, self.events))
        self.clock.advance(len(values))

    def predict(self, steps: int, level: float = 0.9) -> Forecast:
        return apply_events(self.inner.predict(steps, level), self.events)


def rescale_events(
    events: tuple[Event, ...], origin_s: float, time_scale: float, start_s: float | None = None
) -> tuple[Event, ...]:
    """Events of a trace that starts at `origin_s`, on the clock of a replay `time_scale`
    times faster that starts at `start_s` (default: the trace's own start)."""
    start_s = origin_s if start_s is None else start_s
    return tuple(
        replace(
            e,
            start_s=start_s + (e.start_s - origin_s) / time_scale,
            end_s=start_s + (e.end_s - origin_s) / time_scale,
            ramp_up_s=e.ramp_up_s / time_scale,
            ramp_down_s=e.ramp_down_s / time_scale,
        )
        for e in events
    )


def load_events(path: str | Path) -> tuple[Event, ...]:
    """Events from YAML or JSON: `{"events": [{name, start, end, multiplier | rate_rps,
    ramp_up, ramp_down}, ...]}` (a bare list works too). Times are ISO-8601 date-times
    (naive means UTC) or Unix seconds; durations take units ("90s", "20m")."""
    path = Path(path)
    try:
        text = path.read_text()
        document = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
    except FileNotFoundError:
        raise InvalidInput(f"{path}: no such events file") from None
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise InvalidInput(f"{path}: not readable as YAML or JSON ({error})") from None
    return events_from_document(document, str(path))


def events_from_document(document: object, where: str) -> tuple[Event, ...]:
    """Events from a parsed document (a file's, or an API body's); errors name `where`."""
    entries = document.get("events") if isinstance(document, dict) else document
    if not isinstance(entries, list):
        raise InvalidInput(f"{where}: expected a list of events under 'events'")
    return tuple(_event(entry, f"{where}: event {i + 1}") for i, entry in enumerate(entries))


def event_to_dict(event: Event) -> dict[str, object]:
    """The document form `events_from_document` reads back (times in Unix seconds)."""
    document: dict[str, object] = {"name": event.name, "start": event.start_s, "end": event.end_s}
    if event.multiplier is not None:
        document["multiplier"] = event.multiplier
    else:
        document["rate_rps"] = event.rate_rps
    document["ramp_up"] = event.ramp_up_s
    document["ramp_down"] = event.ramp_down_s
    return document


EVENT_KEYS = ("name", "start", "end", "multiplier", "rate_rps", "ramp_up", "ramp_down")
"""The fields an event document may give (`event_to_dict` writes them)."""
NOTE_KEYS = ("peak_rps",)
"""Fields read and ignored: notes for people (`tidal trace promo-day` writes the rate it
expects at each sale's peak)."""


def _event(entry: object, where: str) -> Event:
    if not isinstance(entry, dict):
        raise InvalidInput(f"{where}: expected a mapping of fields")
    _reject_unknown_keys(entry, where)
    try:
        name = str(entry.get("name", where))
        return Event(
            name=name,
            start_s=_moment(entry["start"], f"{where} start"),
            end_s=_moment(entry["end"], f"{where} end"),
            multiplier=_optional_float(entry.get("multiplier"), f"{where} multiplier"),
            rate_rps=_optional_float(entry.get("rate_rps"), f"{where} rate_rps"),
            ramp_up_s=_duration(entry.get("ramp_up", 0), f"{where} ramp_up"),
            ramp_down_s=_duration(entry.get("ramp_down", 0), f"{where} ramp_down"),
        )
    except KeyError as missing:
        raise InvalidInput(f"{where}: missing field {missing.args[0]!r}") from None
    except InvalidInput as error:
        if where in str(error):
            raise
        raise InvalidInput(f"{where}: {error}") from None


def _reject_unknown_keys(entry: dict, where: str) -> None:
    """A misspelt key (`ramp_upp`) would otherwise be ignored: refuse it by name."""
    unknown = [key for key in entry if key not in EVENT_KEYS and key not in NOTE_KEYS]
    if unknown:
        known = ", ".join((*EVENT_KEYS, *NOTE_KEYS))
        raise InvalidInput(f"{where}: unknown key {str(unknown[0])!r} (known: {known})")


def _moment(value: object, where: str) -> float:
    if isinstance(value, datetime):
        return epoch_seconds(value)
    if isinstance(value, bool):  # YAML's `yes`: not a time, though Python counts it an int
        raise InvalidInput(f"{where}: not an ISO-8601 time or Unix seconds: {value!r}")
    if isinstance(value, int | float):
        return float(value)  # a NaN or an infinity is refused, by name, by `Event`
    try:
        return epoch_seconds(datetime.fromisoformat(str(value)))
    except ValueError:
        raise InvalidInput(f"{where}: not an ISO-8601 time or Unix seconds: {value!r}") from None


def _duration(value: object, where: str) -> float:
    if isinstance(value, bool):
        raise InvalidInput(f"{where} must be a duration such as 10ms, 1.5s or 20m, got {value!r}")
    return parse_duration_s(value, field=where)


def _optional_float(value: object, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidInput(f"{where}: expected a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"{where}: expected a number, got {value!r}") from None
