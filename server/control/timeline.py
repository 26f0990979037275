"""A pool's recent history, tick by tick, for the console's charts.

The decision log keeps only noteworthy records; a chart of load, latency and config over
the last hours needs every tick. `Timeline` keeps one row per tick that had news (a
ring of `capacity` rows: six hours at a one-second tick by default) as columns, and
`window` answers the last `seconds` in at most `points` buckets: the mean rate, the
worst p99 and the config at each bucket's end, so a page loads the same few kilobytes
whatever the history's length.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from adaptive.decisions import DecisionRecord

COLUMNS = (
    "time",
    "rate_rps",
    "p99_ms",
    "max_batch",
    "serving_max_batch",
    "warm_max_batch",
    "timeout_ms",
    "replicas",
)


@dataclass(frozen=True, slots=True)
class TimelineRow:
    time: float  # Unix seconds
    rate_rps: float
    p99_ms: float | None
    max_batch: int
    serving_max_batch: int | None  # the smallest cap a worker serves (warm, memory)
    warm_max_batch: int
    timeout_ms: float
    replicas: int | None


class Timeline:
    def __init__(self, capacity: int = 6 * 3600) -> None:
        self.rows: deque[TimelineRow] = deque(maxlen=capacity)

    def record(self, at: float, record: DecisionRecord, serving_cap: int | None) -> None:
        chosen, seen = record.chosen, record.observation
        self.rows.append(
            TimelineRow(
                time=at,
                rate_rps=seen.arrival_rate_rps,
                p99_ms=None if seen.latency_p99_s is None else seen.latency_p99_s * 1e3,
                max_batch=chosen.max_batch_size,
                serving_max_batch=serving_cap,
                warm_max_batch=chosen.warm_target,
                timeout_ms=chosen.timeout_s * 1e3,
                replicas=record.replicas,
            )
        )

    def window(self, now: float, seconds: float, points: int) -> dict[str, Any]:
        """Columns over the last `seconds`, in at most `points` buckets (None: no value)."""
        rows = [r for r in self.rows if r.time > now - seconds]
        buckets = max(1, min(points, len(rows)))
        edges = np.linspace(0, len(rows), buckets + 1).astype(int)
        columns: dict[str, list] = {name: [] for name in COLUMNS}
        for start, stop in itertools.pairwise(edges.tolist()):
            part = rows[start:stop]
            if not part:
                continue
            last = part[-1]
            p99s = [r.p99_ms for r in part if r.p99_ms is not None]
            columns["time"].append(round(last.time, 3))
            columns["rate_rps"].append(round(sum(r.rate_rps for r in part) / len(part), 3))
            columns["p99_ms"].append(round(max(p99s), 3) if p99s else None)
            for name in ("max_batch", "serving_max_batch", "warm_max_batch", "replicas"):
                columns[name].append(getattr(last, name))
            columns["timeout_ms"].append(round(last.timeout_ms, 3))
        return {"seconds": seconds, "rows": len(rows), "columns": columns}


def smallest_serving_cap(latest: dict) -> int | None:
    """The smallest cap any worker serves now, from their latest stats."""
    caps = [s.max_batch_size for s in latest.values() if s.max_batch_size > 0]
    return min(caps) if caps else None
