"""The promotion day compressed for a live benchmark: its arrival instants and its
declared sales on the replay's clock (the Triton and Ray Serve day benchmarks share it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from forecaster.events import event_to_dict, load_events, rescale_events
from forecaster.series import epoch_seconds
from simulations.traces import load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "examples" / "promo_day.csv"
EVENTS = ROOT / "examples" / "promo_day.events.yaml"


def day_arrivals(seconds: float, peak_rps: float, seed: int = 0) -> tuple[np.ndarray, float]:
    """The day's arrival instants compressed into `seconds`, its busiest second scaled to
    `peak_rps` (before compression), and the compression."""
    trace = load_trace(TRACE)
    time_scale = 86_400 / seconds
    rate_scale = peak_rps / (float(trace.counts.max() / trace.step_s) * time_scale)
    scaled = load_trace(TRACE, time_scale=time_scale, rate_scale=rate_scale)
    rng = np.random.default_rng(seed)
    parts = [arrivals for _, arrivals in scaled.arrival_chunks(5.0, rng)]
    times = np.concatenate(parts) if parts else np.zeros(0)
    return times[times < seconds], time_scale


def write_day_events(path: Path, time_scale: float, start_at: float) -> None:
    """The day's flash sales on the replay's clock (Unix `start_at` is the replay's
    zero), as a file for `tidal controller --events`."""
    origin = epoch_seconds(load_trace(TRACE).origin)
    events = rescale_events(load_events(EVENTS), origin, time_scale, start_at)
    path.write_text(json.dumps({"events": [event_to_dict(e) for e in events]}))
