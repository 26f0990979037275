"""Shared test helpers: drive the compiled engine tick by tick with a config schedule."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from adaptive.config import BatchConfig
from adaptive.latency import LatencyModel
from simulations import kernel
from simulations.engine import PoolSettings, Routing, SimulatedPool


def run_engine(
    arrivals: np.ndarray,
    config_for_tick: Callable[[int], BatchConfig],
    *,
    latency: LatencyModel,
    workers: int = 1,
    tick_s: float = 1.0,
    routing: Routing = Routing.SHARED,
    max_queue: int | None = None,
    seed: int = 0,
) -> np.ndarray:
    """Per-request records (kernel.REC_* columns) sorted by request id."""
    settings = PoolSettings(
        workers, slo_s=1.0, routing=routing, max_queue=max_queue, record_requests=True
    )
    pool = SimulatedPool(settings, latency, np.random.default_rng(seed))
    arrivals = np.asarray(arrivals, dtype=np.float64)
    tick = 0
    while True:
        start, end = tick * tick_s, (tick + 1) * tick_s
        lo, hi = np.searchsorted(arrivals, [start, end], side="left")
        pool.advance(start, end, arrivals[lo:hi], config_for_tick(tick))
        tick += 1
        if end > (arrivals[-1] if arrivals.size else 0.0) and pool.queue_depth == 0:
            break
    records = pool.records()
    return records[np.argsort(records[:, kernel.REC_ID], kind="stable")]
