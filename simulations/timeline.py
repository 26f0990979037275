"""Per-window records of a simulated run: what an operator's dashboard would have shown."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from adaptive.config import BatchConfig
from adaptive.histogram import quantile_from_counts
from simulations.engine import TickStats


@dataclass(frozen=True, slots=True)
class WindowRow:
    """One timeline window. Requests count in the window in which their batch started."""

    start_s: float
    end_s: float
    arrivals: int
    completed: int
    shed: int
    p50_ms: float | None
    p99_ms: float | None
    mean_batch_size: float | None
    batch_fill_ratio: float | None
    utilization: float
    max_queue_depth: int
    max_batch_size: int
    timeout_ms: float
    within_slo: int = 0
    served_max_batch: int = 0
    forecast_rps: float | None = None
    forecast_upper_rps: float | None = None
    fallback: bool = False
    replicas: int = 0  # provisioned at the window's end (ready or starting)
    replica_seconds: float = 0.0  # provisioned replica time within the window
    warm_max_batch: int = 0  # the config's warm target at the window's end

    @property
    def arrival_rate_rps(self) -> float:
        return self.arrivals / (self.end_s - self.start_s)


class TimelineBuilder:
    """Folds tick statistics into fixed windows of simulated time."""

    def __init__(self, window_s: float, workers: int) -> None:
        self.window_s = window_s
        self.workers = workers
        self.rows: list[WindowRow] = []
        self._start_s = 0.0
        self._ticks: list[TickStats] = []

    def add_tick(self, stats: TickStats) -> None:
        self._ticks.append(stats)

    def close_window(
        self,
        end_s: float,
        window_counts: np.ndarray,
        config: BatchConfig,
        *,
        served_max_batch: int = 0,
        forecast_rps: float | None = None,
        forecast_upper_rps: float | None = None,
        fallback: bool = False,
        replicas: int | None = None,
        replica_seconds: float | None = None,
    ) -> None:
        """End the window at end_s; `window_counts` is its latency histogram, `config`
        the controller's config at its end and `served_max_batch` the cap the workers ran
        (smaller while buckets warm). On a fleet that scales, `replicas` and
        `replica_seconds` are what was provisioned; otherwise `workers` throughout."""
        ticks = self._ticks
        batches = sum(t.batches for t in ticks)
        span = end_s - self._start_s
        paid_s = self.workers * span if replica_seconds is None else replica_seconds
        p50 = quantile_from_counts(window_counts, 0.5)
        p99 = quantile_from_counts(window_counts, 0.99)
        self.rows.append(
            WindowRow(
                start_s=self._start_s,
                end_s=end_s,
                arrivals=sum(t.arrivals for t in ticks),
                completed=sum(t.completed for t in ticks),
                shed=sum(t.shed for t in ticks),
                p50_ms=None if p50 is None else p50 * 1e3,
                p99_ms=None if p99 is None else p99 * 1e3,
                mean_batch_size=sum(t.batch_size_sum for t in ticks) / batches if batches else None,
                batch_fill_ratio=sum(t.fill_sum for t in ticks) / batches if batches else None,
                utilization=sum(t.busy_s for t in ticks) / paid_s if paid_s else 0.0,
                max_queue_depth=max((t.max_queue_depth for t in ticks), default=0),
                max_batch_size=config.max_batch_size,
                timeout_ms=config.timeout_s * 1e3,
                within_slo=sum(t.within_slo for t in ticks),
                served_max_batch=served_max_batch or config.max_batch_size,
                forecast_rps=forecast_rps,
                forecast_upper_rps=forecast_upper_rps,
                fallback=fallback,
                replicas=self.workers if replicas is None else replicas,
                replica_seconds=paid_s,
                warm_max_batch=config.warm_target,
            )
        )
        self._start_s = end_s
        self._ticks = []
