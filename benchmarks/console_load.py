"""What the console's pool page costs the controller on a pool with a full history.

The page polls every 2 s: the pool summary, the timeline (six hours, bucketed), the
forecast, 20 decisions, the workers and the events. The timeline is the part that grows
with history, so this fills one to its capacity (21,600 ticks: six hours at 1 s) and
times `Timeline.window` at the page's 600 points, against the baseline of returning the
raw rows as JSON-ready columns (what a page without bucketing would fetch), and the JSON
each one serialises to.

    PYTHONPATH=. python benchmarks/console_load.py
"""

from __future__ import annotations

import json
import time

import numpy as np

from adaptive.config import BatchConfig
from adaptive.decisions import DecisionRecord, Mode
from adaptive.policy import Observation
from server.control.timeline import COLUMNS, Timeline

TICKS = 6 * 3600
REPEATS = 20


def filled() -> Timeline:
    timeline = Timeline(capacity=TICKS)
    rng = np.random.default_rng(0)
    for i in range(TICKS):
        seen = Observation(0.0, 1.0, 100, 100, 0, 0, None, float(rng.uniform(0.01, 0.09)),
                           None, None, 0.0)  # fmt: skip
        config = BatchConfig(int(2 ** rng.integers(3, 8)), 0.01)
        record = DecisionRecord(0.0, "p", "predictive", Mode.ACTIVE, seen, None, None, config,
                                config, config, "", None, None, None, ())  # fmt: skip
        timeline.record(1.8e9 + i, record, serving_cap=config.max_batch_size)
    return timeline


def timed(work) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(REPEATS):
        started = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - started)
    return best, result


def raw_columns(timeline: Timeline) -> dict:
    return {name: [getattr(r, name) for r in timeline.rows] for name in COLUMNS}


def main() -> None:
    timeline = filled()
    now = 1.8e9 + TICKS
    bucketed_s, bucketed = timed(lambda: timeline.window(now, 6 * 3600, 600))
    raw_s, raw = timed(lambda: raw_columns(timeline))
    bucketed_json = len(json.dumps(bucketed))
    raw_json = len(json.dumps(raw))
    print(f"{'':28} {'ms':>8} {'JSON KB':>9}")
    print(f"{'timeline, 600 points':28} {bucketed_s * 1e3:>8.1f} {bucketed_json / 1e3:>9.1f}")
    print(f"{'raw rows (baseline)':28} {raw_s * 1e3:>8.1f} {raw_json / 1e3:>9.1f}")
    print(f"bucketed / raw: time x{bucketed_s / raw_s:.2f}, bytes x{bucketed_json / raw_json:.3f}")
    print(json.dumps({
        "benchmark": "console_load", "ticks": TICKS, "points": 600,
        "bucketed_ms": round(bucketed_s * 1e3, 2), "raw_ms": round(raw_s * 1e3, 2),
        "bucketed_json_bytes": bucketed_json, "raw_json_bytes": raw_json,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
