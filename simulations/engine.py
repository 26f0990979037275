"""A simulated pool of workers: the state the compiled kernel advances tick by tick.

`SimulatedPool` owns the queue ring buffers, worker clocks, histograms and jitter draws,
grows them as needed, and turns each tick's raw statistics into a `TickStats` record.
It knows nothing about policies or traces; `simulations.run` drives it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np

from adaptive.change_cost import ReloadTracker
from adaptive.config import BatchConfig
from adaptive.fleet import FleetLimits, FleetView
from adaptive.histogram import (
    BUCKET_LOWER_S,
    BUCKET_REPRESENTATIVES_S,
    INV_LOG_GAMMA,
    MIN_VALUE_S,
    NUM_BUCKETS,
)
from adaptive.latency import LatencyModel, max_feasible_batch
from adaptive.warmup import WarmupStatus, WarmupTracker, bucket_for, warm_time_s
from simulations import kernel as k
from tidal_base.errors import InvalidInput

SAFETY_QUEUE_LIMIT = 5_000_000
"""Waiting requests per queue past which arrivals are shed even with no --max-queue,
so that a config that cannot keep up sheds (and says so) instead of exhausting memory."""


class Routing(enum.StrEnum):
    """How arrivals reach workers: one shared queue, or a queue per worker."""

    SHARED = "shared"
    ROUND_ROBIN = "round-robin"
    SHORTEST_QUEUE = "shortest-queue"

    @property
    def kernel_code(self) -> int:
        return {
            Routing.SHARED: k.ROUTE_SHARED,
            Routing.ROUND_ROBIN: k.ROUTE_ROUND_ROBIN,
            Routing.SHORTEST_QUEUE: k.ROUTE_SHORTEST_QUEUE,
        }[self]


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """The fleet being simulated."""

    workers: int
    slo_s: float
    routing: Routing = Routing.SHARED
    max_queue: int | None = None
    record_requests: bool = False
    warmup_s: float = 0.0
    reload_s: float = 0.0  # an engine that reloads the model for any change (Triton)
    fleet: FleetLimits | None = None  # None: `workers` replicas throughout

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise InvalidInput(f"workers must be >= 1, got {self.workers}")
        if self.fleet is not None and self.routing is not Routing.SHARED:
            raise InvalidInput(
                f"a fleet that scales needs the shared queue (--routing shared), not "
                f"{self.routing.value}: a replica's own queue would have to move when it goes"
            )
        if self.fleet is not None and self.fleet.clamp(self.workers) != self.workers:
            raise InvalidInput(
                f"workers ({self.workers}) must be within the replica limits "
                f"({self.fleet.min_replicas}-{self.fleet.max_replicas})"
            )
        if self.max_queue is not None and self.max_queue < 1:
            raise InvalidInput(f"max_queue must be >= 1, got {self.max_queue}")
        if self.slo_s <= 0:
            raise InvalidInput(f"slo must be > 0, got {self.slo_s}")
        if not 0 <= self.warmup_s < float("inf"):
            raise InvalidInput(f"warmup must be a finite duration >= 0, got {self.warmup_s}")
        if not 0 <= self.reload_s < float("inf"):
            raise InvalidInput(f"reload must be a finite duration >= 0, got {self.reload_s}")

    @property
    def num_queues(self) -> int:
        return 1 if self.routing is Routing.SHARED else self.workers

    @property
    def effective_max_queue(self) -> int:
        return self.max_queue if self.max_queue is not None else SAFETY_QUEUE_LIMIT


@dataclass(frozen=True, slots=True)
class TickStats:
    """What one tick did: counts, sums and the tick's own latency quantiles."""

    arrivals: int
    shed: int
    completed: int
    batches: int
    batch_size_sum: int
    fill_sum: float
    busy_s: float
    latency_sum_s: float
    latency_max_s: float
    within_slo: int
    max_queue_depth: int
    queue_depth: int
    p50_s: float | None
    p99_s: float | None
    # The client account (worker latency plus the overhead outside the batcher); zero
    # and None when the latency model carries no overhead.
    client_within_slo: int = 0
    client_latency_sum_s: float = 0.0
    client_p50_s: float | None = None
    client_p99_s: float | None = None

    @classmethod
    def from_vector(cls, vector: np.ndarray) -> TickStats:
        v = vector.tolist()
        p50, p99 = v[k.ST_P50_S], v[k.ST_P99_S]
        client_p50, client_p99 = v[k.ST_CLIENT_P50_S], v[k.ST_CLIENT_P99_S]
        return cls(
            int(v[k.ST_ARRIVALS]),
            int(v[k.ST_SHED]),
            int(v[k.ST_COMPLETED]),
            int(v[k.ST_BATCHES]),
            int(v[k.ST_BATCH_SIZE_SUM]),
            v[k.ST_FILL_SUM],
            v[k.ST_BUSY_S],
            v[k.ST_LATENCY_SUM_S],
            v[k.ST_LATENCY_MAX_S],
            int(v[k.ST_WITHIN_SLO]),
            int(v[k.ST_MAX_QUEUE_DEPTH]),
            int(v[k.ST_QUEUE_DEPTH_END]),
            None if p50 != p50 else p50,
            None if p99 != p99 else p99,
            int(v[k.ST_CLIENT_WITHIN_SLO]),
            v[k.ST_CLIENT_LATENCY_SUM_S],
            None if client_p50 != client_p50 else client_p50,
            None if client_p99 != client_p99 else client_p99,
        )


@dataclass(frozen=True, slots=True)
class ServiceTable:
    """Mean service seconds and jitter sigma by batch size (index 0 unused)."""

    mean_s: np.ndarray
    sigma: np.ndarray
    jittered: bool


class SimulatedPool:
    """Workers, queues and histograms of one simulated pool under a changing config."""

    def __init__(
        self, settings: PoolSettings, latency: LatencyModel, jitter_rng: np.random.Generator
    ) -> None:
        self.settings = settings
        self.latency = latency
        self.max_feasible_batch = max_feasible_batch(latency)
        self.clamped_from: int | None = None
        self._rng = jitter_rng
        self._tables: dict[int, ServiceTable] = {}
        queues = settings.num_queues
        self._qtime = np.zeros((queues, 1024))
        self._qid = np.zeros((queues, 1024), dtype=np.int64)
        self._qhead = np.zeros(queues, dtype=np.int64)
        self._qlen = np.zeros(queues, dtype=np.int64)
        self.worker_free = np.zeros(settings.workers)
        # A replica slot is provisioned (ready, or starting until `_ready_at`) or gone
        # (its worker_free is inf, so the kernel never picks it); gone slots are reused.
        self._provisioned = np.ones(settings.workers, dtype=bool)
        self._ready_at = np.zeros(settings.workers)
        self._fleet_view: tuple[float, float, FleetView] | None = None  # from, until, view
        self.replica_seconds = 0.0  # provisioned replica time, ready or starting
        self.replica_starts = 0
        self._istate = np.zeros(k.NUM_INT_STATE, dtype=np.int64)
        self._stats = np.zeros(k.NUM_STATS)
        self._tick_hist = np.zeros((2, NUM_BUCKETS), dtype=np.int64)  # worker, client
        self._hist_params = np.array([MIN_VALUE_S, INV_LOG_GAMMA])
        self._normals = np.zeros(0)
        self._uniforms = np.zeros(0)
        # Overhead draws from a child stream: the jitter draws, and so the worker's own
        # account, are the same with a client account as without.
        self._client_rng = jitter_rng.spawn(1)[0] if latency.overhead is not None else None
        self._no_overhead = np.zeros(0)
        self._overhead_by_band: dict[int, np.ndarray] = {}
        self._records = np.zeros((0, k.NUM_REC_COLUMNS))
        self._record_chunks: list[np.ndarray] = []
        self._routing_code = settings.routing.kernel_code
        self._max_queue = settings.effective_max_queue
        self._depth = 0  # total waiting, from the kernel's last report
        self._largest_queue = 0  # an upper bound on the longest single queue
        self._warmup: WarmupTracker | None = None  # made on the first tick, warm for its cap
        self._requested_cap = 0
        self._padded = settings.warmup_s > 0
        self._reload: ReloadTracker | None = None  # made on the first tick, for its config
        self.served_max_batch = 0  # the cap the workers ran in the last tick

    @property
    def queue_depth(self) -> int:
        return self._depth

    def applicable(self, config: BatchConfig) -> BatchConfig:
        """The config as the pool can run it: clamped to the memory limit, noted once."""
        cap = self.max_feasible_batch
        if cap is None or config.warm_target <= cap:
            return config
        if config.max_batch_size > cap:
            self.clamped_from = max(self.clamped_from or 0, config.max_batch_size)
        return BatchConfig(
            min(cap, config.max_batch_size), config.timeout_s, min(cap, config.warm_max_batch)
        )

    def serving(self, config: BatchConfig, now: float) -> BatchConfig:
        """The config the workers run at `now` when asked for `config`: clamped to memory,
        and, with warm-up on, to the buckets warmed so far."""
        config = self._reloaded(self.applicable(config), now)
        if not self._padded:
            return config
        cap, warm = config.max_batch_size, config.warm_target
        if self._warmup is None:
            self._warmup = WarmupTracker(self.settings.warmup_s, warm)
        if warm != self._requested_cap:
            self._warmup.request(warm, now)
            self._requested_cap = warm
        served = self._warmup.effective_cap(cap, now)
        return config if served == cap else BatchConfig(served, config.timeout_s)

    def _reloaded(self, config: BatchConfig, now: float) -> BatchConfig:
        """With reloads modelled, the config asked for serves only once its reload is
        done; the one before serves meanwhile."""
        if not self.settings.reload_s:
            return config
        if self._reload is None:
            self._reload = ReloadTracker(self.settings.reload_s, config)
        self._reload.request(config, now)
        return self._reload.in_force(now)

    @property
    def reloads(self) -> int:
        """Model reloads the pool's engine has started (0 when reloads are not modelled)."""
        return 0 if self._reload is None else self._reload.reloads

    def warmup_status(self, now: float) -> WarmupStatus | None:
        """Warmed and warming buckets; None when warm-up is not modelled."""
        return None if self._warmup is None else self._warmup.status(now)

    def fleet(self, now: float) -> FleetView:
        """The replicas at `now`: ready, starting, and the count provisioned."""
        cached = self._fleet_view
        # The view holds from when it was taken until the next starting replica is ready
        # (or a resize): asked twice a tick, it is counted only when it can have changed.
        if cached is not None and cached[0] <= now < cached[1]:
            return cached[2]
        provisioned = int(self._provisioned.sum())
        ready = int((self._provisioned & (self._ready_at <= now)).sum())
        startup_s = self.settings.fleet.startup_s if self.settings.fleet else 0.0
        view = FleetView(ready, provisioned - ready, provisioned, startup_s)
        pending = self._ready_at[self._provisioned & (self._ready_at > now)]
        self._fleet_view = (now, float(pending.min()) if pending.size else math.inf, view)
        return view

    def resize(self, replicas: int, now: float) -> None:
        """Provision `replicas` from `now`. A new replica serves after the start-up time
        and the warm-up of every bucket up to the pool's warm target (it takes traffic
        once warm, as a readiness probe would let it); a removed one finishes its batch
        (paid for until then) and takes no more. Replicas still starting go first, then
        the idlest ready ones."""
        limits = self.settings.fleet
        if limits is None:
            raise InvalidInput("this pool's fleet is fixed (no replica limits)")
        self._fleet_view = None
        change = replicas - int(self._provisioned.sum())
        if change > 0:
            # A fresh replica has nothing warm: every bucket up to the target, 1 included.
            cap = self._requested_cap  # 0 until the first tick asked for a warm target
            warm_s = warm_time_s(0, cap, self.settings.warmup_s) if cap else 0.0
            for _ in range(change):
                self._start_replica(now + limits.startup_s + warm_s)
        for _ in range(-change):
            self._stop_replica(now)

    def _start_replica(self, ready_at: float) -> None:
        gone = np.flatnonzero(~self._provisioned)
        if gone.size:
            slot = int(gone[0])
        else:
            slot = self.worker_free.size
            self.worker_free = np.append(self.worker_free, 0.0)
            self._provisioned = np.append(self._provisioned, False)
            self._ready_at = np.append(self._ready_at, 0.0)
        self.worker_free[slot] = ready_at
        self._ready_at[slot] = ready_at
        self._provisioned[slot] = True
        self.replica_starts += 1

    def _stop_replica(self, now: float) -> None:
        slots = np.flatnonzero(self._provisioned)
        starting = slots[self._ready_at[slots] > now]
        if starting.size:
            slot = int(starting[np.argmax(self._ready_at[starting])])  # the latest to come
        else:
            slot = int(slots[np.argmin(self.worker_free[slots])])  # the idlest
            self.replica_seconds += max(0.0, float(self.worker_free[slot]) - now)
        self.worker_free[slot] = math.inf
        self._provisioned[slot] = False

    @property
    def last_busy_s(self) -> float:
        """When the last batch dispatched so far completes (0 before any)."""
        busy = self.worker_free[np.isfinite(self.worker_free)]
        return float(busy.max()) if busy.size else 0.0

    @property
    def client_account(self) -> bool:
        """Whether ticks carry a client account (the latency model has an overhead)."""
        return self.latency.overhead is not None

    def advance(
        self,
        t_start: float,
        t_end: float,
        arrivals: np.ndarray,
        config: BatchConfig,
        rate_rps: float | None = None,
    ) -> TickStats:
        """Run the pool from t_start to t_end under `config`, taking `arrivals` (sorted).

        With an overhead, each request's is drawn at the rate each ready worker is
        offered: `rate_rps` (the pool's) when given, else this tick's arrivals over its
        length, shared by the workers."""
        # Runs once per tick per policy: keep the Python side lean (no numpy reductions).
        if self.settings.fleet is not None:
            self.replica_seconds += int(self._provisioned.sum()) * (t_end - t_start)
        config = self.serving(config, t_start)
        self.served_max_batch = config.max_batch_size
        table = self._service_table(config.max_batch_size)
        arriving = arrivals.shape[0]
        incoming = arriving + self._depth
        if self._largest_queue + arriving > self._qtime.shape[1]:
            self._grow_queues(self._largest_queue + arriving)
        if table.jittered:
            self._ensure_normals(incoming)
        overhead_s = self._no_overhead
        if self.latency.overhead is not None:
            if rate_rps is None:
                rate_rps = arriving / (t_end - t_start) if t_end > t_start else 0.0
            overhead_s = self._overhead_at(rate_rps / self._ready_workers(t_start))
            self._ensure_uniforms(incoming)
        records = self._record_buffer(incoming)
        k.run_tick(
            float(t_start),
            float(t_end),
            arrivals,
            config.max_batch_size,
            config.timeout_s,
            self._max_queue,
            self._routing_code,
            table.mean_s,
            table.sigma,
            self._normals,
            self.settings.slo_s,
            self._qtime,
            self._qid,
            self._qhead,
            self._qlen,
            self.worker_free,
            self._istate,
            self._stats,
            self._tick_hist,
            self._hist_params,
            BUCKET_LOWER_S,
            BUCKET_REPRESENTATIVES_S,
            records,
            overhead_s,
            self._uniforms,
        )
        self._keep_records(records)
        stats = TickStats.from_vector(self._stats)
        self._depth = stats.queue_depth
        self._largest_queue = stats.max_queue_depth if self._routing_code else stats.queue_depth
        return stats

    @property
    def tick_histogram(self) -> np.ndarray:
        """Latency bucket counts of the last tick (adaptive.histogram layout)."""
        return self._tick_hist[k.HIST_TICK]

    @property
    def client_histogram(self) -> np.ndarray:
        """The last tick's client latency bucket counts (zeros without an overhead)."""
        return self._tick_hist[k.HIST_CLIENT]

    def _ready_workers(self, now: float) -> int:
        if self.settings.fleet is None:
            return self.settings.workers
        return max(1, self.fleet(now).ready)

    def _overhead_at(self, worker_rate_rps: float) -> np.ndarray:
        """The overhead's inverse CDF at a worker's rate, cached per 1% band of rate."""
        band = round(math.log(max(worker_rate_rps, 1e-3)) / math.log(1.01))
        grid = self._overhead_by_band.get(band)
        if grid is None:
            assert self.latency.overhead is not None
            grid = self.latency.overhead.inverse_cdf_s(1.01**band)
            self._overhead_by_band[band] = grid
        return grid

    def records(self) -> np.ndarray:
        """Per-request rows (see kernel.REC_*), in dispatch order; needs record_requests."""
        if not self._record_chunks:
            return np.zeros((0, k.NUM_REC_COLUMNS))
        return np.concatenate(self._record_chunks)

    def _service_table(self, max_batch: int) -> ServiceTable:
        table = self._tables.get(max_batch)
        if table is None:
            sizes = np.arange(max_batch + 1)
            if self._padded:  # a batch runs at the cost of the bucket it is padded to
                sizes = self._padded_sizes(sizes)
            mean = self.latency.mean_s(sizes)
            mean[0] = 0.0
            sigma = self.latency.jitter_sigma(sizes)
            table = ServiceTable(mean, sigma, bool(sigma.any()))
            self._tables[max_batch] = table
        return table

    def _padded_sizes(self, sizes: np.ndarray) -> np.ndarray:
        limit = self.max_feasible_batch
        padded = np.array([bucket_for(int(n)) for n in sizes])
        return padded if limit is None else np.minimum(padded, limit)

    def _grow_queues(self, needed: int) -> None:
        cap = self._qtime.shape[1]
        needed = min(needed, self._max_queue)
        if needed <= cap:
            return
        new_cap = 1 << (needed - 1).bit_length()  # the kernel masks with capacity - 1
        qtime = np.zeros((self._qtime.shape[0], new_cap))
        qid = np.zeros((self._qtime.shape[0], new_cap), dtype=np.int64)
        for q in range(self._qtime.shape[0]):
            order = (self._qhead[q] + np.arange(self._qlen[q])) % cap
            qtime[q, : self._qlen[q]] = self._qtime[q, order]
            qid[q, : self._qlen[q]] = self._qid[q, order]
        self._qtime, self._qid = qtime, qid
        self._qhead[:] = 0

    def _ensure_normals(self, max_batches: int) -> None:
        position = int(self._istate[k.IS_NORMAL_POS])
        if self._normals.shape[0] - position >= max_batches:
            return
        fresh = self._rng.standard_normal(max(max_batches, 65536))
        self._normals = np.concatenate((self._normals[position:], fresh))
        self._istate[k.IS_NORMAL_POS] = 0

    def _ensure_uniforms(self, max_requests: int) -> None:
        position = int(self._istate[k.IS_UNIFORM_POS])
        if self._uniforms.shape[0] - position >= max_requests:
            return
        assert self._client_rng is not None
        fresh = self._client_rng.random(max(max_requests, 65536))
        self._uniforms = np.concatenate((self._uniforms[position:], fresh))
        self._istate[k.IS_UNIFORM_POS] = 0

    def _record_buffer(self, incoming: int) -> np.ndarray:
        if not self.settings.record_requests:
            return self._records
        self._istate[k.IS_RECORDS] = 0
        return np.zeros((incoming, k.NUM_REC_COLUMNS))

    def _keep_records(self, records: np.ndarray) -> None:
        if self.settings.record_requests:
            self._record_chunks.append(records[: int(self._istate[k.IS_RECORDS])])
