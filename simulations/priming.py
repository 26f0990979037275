"""A trace's opening span as the forecasts' history: `simulate --prime 1d`.

Live, the control plane primes every forecast from the arrivals the bus recorded before
it started (`ForecastFeed.prime`), so a planner never meets the day's traffic with an
empty history. A replay that starts cold judges a policy on its first day too, when no
forecaster has seen a season yet and only the oracle can know the morning's rise. So a
trace's first `span` can be split off: its arrivals per second prime each policy's
forecast as the live plane's are primed, and only the rest is replayed and scored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import timedelta

import numpy as np

from simulations.trace_formats import RequestTokens
from simulations.traces import CountTrace, RequestTrace, Trace
from tidal_base.errors import InvalidInput


@dataclass(frozen=True)
class PrimedTrace:
    """The arrivals per second of a trace's opening span (rate-scaled, the history a
    bus would hold), and the rest of the trace, on its own clock from 0."""

    history: np.ndarray
    trace: Trace


def split_history(trace: Trace, span_s: float) -> PrimedTrace:
    """The first `span_s` (whole seconds, leaving some of the trace to replay) as
    history, the rest as the trace to replay; its origin moves on by `span_s`."""
    if span_s <= 0 or span_s != math.floor(span_s):
        raise InvalidInput(f"--prime must be a positive whole number of seconds, got {span_s:g}")
    if span_s >= trace.duration_s:
        raise InvalidInput(
            f"--prime {span_s:g}s leaves nothing of {trace.name} to replay "
            f"(it lasts {trace.duration_s:g}s)"
        )
    if isinstance(trace, CountTrace):
        history, rest = _split_counts(trace, span_s)
    elif isinstance(trace, RequestTrace):
        history, rest = _split_requests(trace, span_s)
    else:  # pragma: no cover - the two kinds load_trace makes
        raise InvalidInput(f"cannot prime from a {type(trace).__name__}")
    origin = None if trace.origin is None else trace.origin + timedelta(seconds=span_s)
    return PrimedTrace(history, replace(rest, origin=origin))


def _split_counts(trace: CountTrace, span_s: float) -> tuple[np.ndarray, CountTrace]:
    steps = span_s / trace.step_s
    if abs(steps - round(steps)) > 1e-9:
        raise InvalidInput(
            f"--prime {span_s:g}s must be a whole number of {trace.name}'s "
            f"{trace.step_s:g}s intervals"
        )
    # Expected arrivals per second: the cumulative count, linear within an interval.
    edges = np.arange(trace.counts.size + 1) * trace.step_s
    cumulative = np.concatenate(([0.0], np.cumsum(trace.counts, dtype=np.float64)))
    seconds = np.arange(int(span_s) + 1, dtype=np.float64)
    history = np.diff(np.interp(seconds, edges, cumulative)) * trace.rate_scale
    return history, replace(trace, counts=trace.counts[round(steps) :])


def _split_requests(trace: RequestTrace, span_s: float) -> tuple[np.ndarray, RequestTrace]:
    cut = int(np.searchsorted(trace.arrivals_s, span_s, side="left"))
    bins = np.arange(int(span_s) + 1, dtype=np.float64)
    counts, _ = np.histogram(trace.arrivals_s[:cut], bins=bins)
    tokens = trace.tokens
    if tokens is not None:
        tokens = RequestTokens(tokens.input[cut:], tokens.output[cut:])
    rest = replace(trace, arrivals_s=trace.arrivals_s[cut:] - span_s, tokens=tokens)
    return counts * trace.rate_scale, rest
