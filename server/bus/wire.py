"""The wire format of a worker's stats entry: versioned JSON that old and new readers share.

An entry is `{"schema": N, ...fields of WorkerStats}`. Readers take the fields they know
and ignore the rest, so a rolling upgrade that adds a field never stops an older
controller; an entry that lacks a field this reader needs, or carries a value of the
wrong kind, is refused with `MalformedStats` naming the field, and the reader skips it.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np

from adaptive.bus import WorkerStats
from adaptive.histogram import NUM_BUCKETS
from adaptive.learned_latency import ExecutionTimes
from tidal_base.errors import TidalError

SCHEMA = 1
"""Bumped when a field changes meaning; adding a field keeps the schema."""

# In-process only: the dense histogram goes out as pairs, and quantiles are recomputed.
_FIELDS = {f.name for f in dataclasses.fields(WorkerStats)} - {
    "latency_counts",
    "latency_p50_s",
    "latency_p99_s",
}
_REQUIRED = {f.name for f in dataclasses.fields(WorkerStats) if f.default is dataclasses.MISSING}
_PAIRS = ("latency_buckets", "batch_sizes", "ingress_buckets")


class MalformedStats(TidalError):
    """A stats entry this reader cannot use; the message names the field."""


def encode_stats(stats: WorkerStats) -> str:
    fields = {f: getattr(stats, f) for f in _FIELDS}
    if stats.latency_counts is not None:  # an in-process reporter's dense histogram
        nonzero = np.flatnonzero(stats.latency_counts)
        dense = stats.latency_counts[nonzero].tolist()
        fields["latency_buckets"] = [
            *stats.latency_buckets,
            *zip(nonzero.tolist(), dense, strict=True),
        ]
    fields["execution"] = [
        [t.padded_size, t.batches, t.total_s, t.buckets] for t in stats.execution
    ]
    return json.dumps({"schema": SCHEMA, **fields})


def decode_stats(text: str) -> WorkerStats:
    """The `WorkerStats` in one entry; unknown fields are ignored."""
    try:
        fields = json.loads(text)
    except (TypeError, ValueError) as error:
        raise MalformedStats(f"not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise MalformedStats(f"not an object: {type(fields).__name__}")
    missing = sorted(_REQUIRED - set(fields))
    if missing:
        raise MalformedStats(f"missing field {missing[0]!r}")
    known: dict[str, Any] = {name: fields[name] for name in _FIELDS & set(fields)}
    try:
        for name in _PAIRS & known.keys():  # ingress_buckets: newer workers only
            known[name] = tuple((int(a), int(b)) for a, b in known[name])
        if known["warmed_buckets"] is not None:
            known["warmed_buckets"] = tuple(int(b) for b in known["warmed_buckets"])
        known["execution"] = tuple(_execution(e) for e in known.get("execution") or ())
        return _checked(WorkerStats(**known))
    except (TypeError, ValueError) as error:
        raise MalformedStats(f"bad value: {error}") from None


def _execution(entry: Any) -> ExecutionTimes:
    """One `[padded size, batches, total seconds, [[bucket, count], ...]]` entry."""
    size, batches, total_s, buckets = entry
    times = ExecutionTimes(
        int(size), int(batches), float(total_s), tuple((int(b), int(c)) for b, c in buckets)
    )
    in_range = all(0 <= b < NUM_BUCKETS and c >= 0 for b, c in times.buckets)
    if times.padded_size < 1 or times.batches < 0 or not times.total_s >= 0 or not in_range:
        raise MalformedStats(f"field 'execution' has a bad entry: {entry!r}")
    return times


def _checked(stats: WorkerStats) -> WorkerStats:
    for name in ("arrivals", "completed", "shed", "queue_depth", "max_batch_size"):
        value = getattr(stats, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise MalformedStats(f"field {name!r} must be an integer >= 0, got {value!r}")
    for name in ("window_s", "busy_s", "latency_sum_s"):
        value = getattr(stats, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise MalformedStats(f"field {name!r} must be a number >= 0, got {value!r}")
    for name in ("latency_buckets", "ingress_buckets"):
        if any(not 0 <= b < NUM_BUCKETS or c < 0 for b, c in getattr(stats, name)):
            raise MalformedStats(f"field {name!r} holds a bucket outside 0-{NUM_BUCKETS - 1}")
    if not isinstance(stats.worker, str) or not stats.worker:
        raise MalformedStats(f"field 'worker' must be a non-empty string, got {stats.worker!r}")
    return stats
