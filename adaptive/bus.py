"""What travels between a pool's workers and its controller, and the observation built
from it.

Workers report `WorkerStats` per window; `observe_pool` merges one tick's reports into
the `PoolStats` the controller steps on. The simulator and the live control loop both
call it (the simulator's pool reports as one `WorkerStats` of `replicas` workers), so a
policy sees the same observation in both. Configs travel as a `VersionedConfig` whose
version only grows, so a worker can ignore anything older than what it runs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from adaptive.config import BatchConfig
from adaptive.histogram import BUCKET_REPRESENTATIVES_S, NUM_BUCKETS, add_buckets
from adaptive.learned_latency import ExecutionTimes
from adaptive.policy import Observation


@dataclass(frozen=True, slots=True)
class VersionedConfig:
    """A config as the pool's controller published it: `version` grows with every publication, so a
    worker applies only a version newer than the one it runs."""

    version: int
    config: BatchConfig


@dataclass(frozen=True, slots=True)
class PoolStats:
    """What a pool's workers reported for one control tick: the observation the
    controller steps on, the buckets every worker has warm (None: the engine does not
    model warm-up; (): nothing is warm yet), the oldest config version running, and the
    execution times the workers measured per padded batch size (for the learned latency
    model; () where none were reported)."""

    observation: Observation
    warmed_buckets: tuple[int, ...] | None = None
    config_version: int = 0
    execution: tuple[ExecutionTimes, ...] = ()


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """What one reporter did over one window: a live worker (it reports every second),
    or a simulated pool of `replicas` workers (it reports every tick).

    Latencies are sparse `adaptive.histogram` bucket counts, so a pool's reports merge
    exactly into one histogram (an in-process reporter, the simulator, may hand its dense
    `latency_counts` instead: no round trip through pairs every tick); `batch_sizes` is
    the (size, batches) distribution, and
    `batches`, `batch_size_sum` and `fill_sum` (the sum over batches of size / cap in
    force) are derived from it against `max_batch_size` unless given. `warmed_buckets`
    None means the engine does not model warm-up.
    """

    worker: str
    window_s: float
    arrivals: int
    completed: int
    shed: int
    latency_buckets: tuple[tuple[int, int], ...]
    latency_sum_s: float
    batch_sizes: tuple[tuple[int, int], ...]
    busy_s: float
    queue_depth: int
    max_batch_size: int
    warmed_buckets: tuple[int, ...] | None
    config_version: int
    replicas: int = 1
    batches: int | None = None
    batch_size_sum: int | None = None
    fill_sum: float | None = None
    latency_counts: np.ndarray | None = field(default=None, compare=False, repr=False)
    # The reporter's own nearest-rank p50/p99 of its histogram, when it has them (the
    # simulator's kernel computes them every tick): used as they are when a tick holds
    # this report alone, so the simulator does not rescan 1,282 buckets per tick.
    latency_p50_s: float | None = None
    latency_p99_s: float | None = None
    # Execution times of the window's batches by padded size (a live worker measures
    # them; () from a reporter that does not, such as the simulator, whose times are
    # its latency model by construction).
    execution: tuple[ExecutionTimes, ...] = ()
    # Time from the worker's socket to the batcher, per request (sparse histogram
    # counts, as `latency_buckets`): the HTTP layer's queue, before the batching rule
    # sees a request. () from a reporter without an HTTP layer (the simulator).
    ingress_buckets: tuple[tuple[int, int], ...] = ()
    ingress_sum_s: float = 0.0

    def __post_init__(self) -> None:
        if self.batches is None:
            object.__setattr__(self, "batches", sum(n for _, n in self.batch_sizes))
        if self.batch_size_sum is None:
            sizes = sum(size * n for size, n in self.batch_sizes)
            object.__setattr__(self, "batch_size_sum", sizes)
        if self.fill_sum is None:
            cap = max(self.max_batch_size, 1)
            object.__setattr__(self, "fill_sum", sum(s * n for s, n in self.batch_sizes) / cap)

    @property
    def covered_s(self) -> float:
        """Worker-seconds this report covers."""
        return self.replicas * self.window_s


def observe_pool(
    reports: Sequence[WorkerStats], ended_at: float, tick_s: float, workers: int
) -> PoolStats:
    """The pool's `PoolStats` for one control tick from the reports that arrived in it:
    the one function both shells build the controller's observation with.

    Rates and utilisation are normalised by the worker-seconds the reports cover, so a
    tick that holds two windows of one worker (windows are not aligned with ticks) does
    not read as a surge, and scaled to the pool's `workers`; the arrival count is the
    sum, so every arrival reaches the forecast exactly once. Queue depth and warmed
    buckets are levels: each worker's latest report counts, and the pool can rely only
    on the buckets that every worker has warm (a cold worker that just joined counts).
    """
    covered_s = busy_s = fill_sum = 0.0
    arrivals = completed = shed = batches = size_sum = 0
    for r in reports:  # one pass: this runs every tick of every simulated policy
        covered_s += r.replicas * r.window_s
        arrivals += r.arrivals
        completed += r.completed
        shed += r.shed
        batches += r.batches
        size_sum += r.batch_size_sum
        fill_sum += r.fill_sum
        busy_s += r.busy_s
    p50_s, p99_s = _latency_quantiles(reports)
    latest = {r.worker: r for r in reports}  # reports arrive oldest first
    observation = Observation(
        ended_at=ended_at,
        window_s=tick_s,
        arrivals=arrivals,
        completed=completed,
        shed=shed,
        queue_depth=sum(r.queue_depth for r in latest.values()),
        latency_p50_s=p50_s,
        latency_p99_s=p99_s,
        mean_batch_size=size_sum / batches if batches else None,
        batch_fill_ratio=fill_sum / batches if batches else None,
        utilization=busy_s / covered_s if covered_s else 0.0,
        batches=batches,
        busy_s=busy_s,
        rate_rps=arrivals * max(workers, 1) / covered_s if covered_s else 0.0,
    )
    version = min((r.config_version for r in reports), default=0)
    execution = tuple(t for r in reports for t in r.execution)
    return PoolStats(observation, _warm_everywhere(latest.values()), version, execution)


def _latency_quantiles(reports: Sequence[WorkerStats]) -> tuple[float | None, float | None]:
    """p50 and p99 of the reports' merged histograms, nearest rank, as
    `adaptive.histogram.quantile_from_counts` reads them."""
    if len(reports) == 1 and reports[0].latency_p99_s is not None:
        return reports[0].latency_p50_s, reports[0].latency_p99_s
    if len(reports) == 1 and reports[0].latency_counts is not None:
        counts = reports[0].latency_counts
    else:
        counts = np.zeros(NUM_BUCKETS, dtype=np.int64)
        for report in reports:
            if report.latency_counts is not None:
                counts += report.latency_counts
            add_buckets(counts, report.latency_buckets)
    cumulative = counts.cumsum()
    total = int(cumulative[-1])
    if not total:
        return None, None
    p50 = BUCKET_REPRESENTATIVES_S[cumulative.searchsorted(max(1, math.ceil(0.5 * total)))]
    p99 = BUCKET_REPRESENTATIVES_S[cumulative.searchsorted(max(1, math.ceil(0.99 * total)))]
    return float(p50), float(p99)


def _warm_everywhere(latest: Iterable[WorkerStats]) -> tuple[int, ...] | None:
    """Buckets are prefixes (1, 2, 4, ...), so what every worker has warm is the shortest."""
    modelled = [r.warmed_buckets for r in latest if r.warmed_buckets is not None]
    return min(modelled, key=len) if modelled else None
