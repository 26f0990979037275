"""Replay a trace through one simulated pool per policy, side by side, tick by tick.

Every control tick each policy's pool consumes the same arrivals, the policy sees an
`Observation` of that tick and answers with a config for the next one: the same seam
the live control plane drives. Arrivals are generated in chunks and shared, so memory
stays flat however long the trace.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from adaptive.bus import WorkerStats, observe_pool
from adaptive.controller import Controller, ControllerSettings
from adaptive.decisions import DecisionRecord, Mode
from adaptive.forecast_feed import ForecastFeed
from adaptive.guards import Guardrails
from adaptive.histogram import (
    BUCKET_REPRESENTATIVES_S,
    NUM_BUCKETS,
    LatencyHistogram,
    LatencySummary,
)
from adaptive.latency import LatencyModel
from adaptive.policy import Policy
from forecaster.events import Event
from simulations.arrivals import ArrivalStream
from simulations.engine import PoolSettings, SimulatedPool, TickStats
from simulations.timeline import TimelineBuilder, WindowRow
from simulations.traces import Trace
from tidal_base.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class SimulationSettings:
    """How to replay: the pool, control tick, timeline window and seed."""

    pool: PoolSettings
    tick_s: float = 1.0
    window_s: float = 10.0
    chunk_s: float = 60.0
    seed: int = 0
    events: tuple[Event, ...] = ()
    origin_s: float = 0.0
    guardrails: Guardrails = field(default_factory=Guardrails)
    on_trace_clock: bool = False  # origin_s is the trace's own start, not time-scaled
    # Arrivals per second before the replay's start (`simulations.priming`): each
    # policy's forecast is primed with them, as the live plane primes from the bus.
    history: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.tick_s <= 0:
            raise InvalidInput(f"tick must be > 0, got {self.tick_s}")
        ratio = self.window_s / self.tick_s
        if self.window_s <= 0 or abs(ratio - round(ratio)) > 1e-9:
            raise InvalidInput(
                f"window ({self.window_s:g}s) must be a positive multiple of the tick "
                f"({self.tick_s:g}s)"
            )

    @property
    def ticks_per_window(self) -> int:
        return round(self.window_s / self.tick_s)

    def controller_settings(self, pool: str) -> ControllerSettings:
        """The controller settings this replay gives each policy's controller (the parity
        test hands the live loop the same)."""
        return ControllerSettings(
            pool=pool,
            slo_s=self.pool.slo_s,
            tick_s=self.tick_s,
            workers=self.pool.workers,
            warmup_s=self.pool.warmup_s,
            reload_s=self.pool.reload_s,
            origin_s=self.origin_s,
            events=self.events,
            guardrails=self.guardrails,
            fleet=self.pool.fleet,
        )


@dataclass(frozen=True)
class PolicyResult:
    """What one policy did over the whole trace."""

    policy: str
    requests: int
    completed: int
    shed: int
    within_slo: int
    latency: LatencySummary
    batches: int
    batch_size_sum: int
    fill_sum: float
    busy_s: float
    workers: int
    span_s: float
    wall_s: float
    config_changes: int
    timeline: tuple[WindowRow, ...]
    fallback_s: float = 0.0
    # Forecast fits that raised (the policy's and its shadow's), and the last one's error:
    # the feed kept its last good fit and retried after a backoff.
    fit_failures: int = 0
    last_fit_error: str | None = None
    decisions: tuple[DecisionRecord, ...] = field(default=(), repr=False)
    clamped_from: int | None = None
    max_feasible_batch: int | None = None
    safety_shed: bool = False
    records: np.ndarray | None = field(default=None, repr=False)
    replica_seconds: float = 0.0  # provisioned replica time (ready or starting)
    replica_changes: int = 0
    max_replicas: int = 0  # the most replicas provisioned at once
    # What clients see (the worker's latency plus the overhead outside the batcher), when
    # the latency model carries that overhead; None otherwise.
    client_latency: LatencySummary | None = None
    client_within_slo: int | None = None

    @property
    def throughput_rps(self) -> float:
        return self.completed / self.span_s if self.span_s else 0.0

    @property
    def slo_attainment(self) -> float:
        offered = self.completed + self.shed
        return self.within_slo / offered if offered else 1.0

    @property
    def client_slo_attainment(self) -> float | None:
        """The share of requests a client saw answered within the SLO (None without an
        overhead to add): what a rollout is judged on when it is known."""
        if self.client_within_slo is None:
            return None
        offered = self.completed + self.shed
        return self.client_within_slo / offered if offered else 1.0

    @property
    def mean_batch_size(self) -> float:
        return self.batch_size_sum / self.batches if self.batches else 0.0

    @property
    def batch_fill_ratio(self) -> float:
        return self.fill_sum / self.batches if self.batches else 0.0

    @property
    def utilization(self) -> float:
        """Busy time over the replica time paid for."""
        return self.busy_s / self.replica_seconds if self.replica_seconds else 0.0

    @property
    def sim_requests_per_s(self) -> float:
        return self.requests / self.wall_s if self.wall_s else 0.0

    @property
    def busy_seconds_per_1k(self) -> float:
        """GPU busy seconds per 1,000 completed requests: the cost of serving."""
        return 1e3 * self.busy_s / self.completed if self.completed else 0.0

    def worst_window_attainment(self, span_s: float = 600.0) -> float:
        """The lowest SLO attainment over any `span_s` of consecutive timeline windows."""
        rows = self.timeline
        if not rows:
            return 1.0
        width = max(1, round(span_s / (rows[0].end_s - rows[0].start_s)))
        offered = np.array([r.completed + r.shed for r in rows], dtype=np.float64)
        within = np.array([r.within_slo for r in rows], dtype=np.float64)
        kernel = np.ones(min(width, len(rows)))
        offered_sums = np.convolve(offered, kernel, mode="valid")
        within_sums = np.convolve(within, kernel, mode="valid")
        busy = offered_sums > 0
        return float((within_sums[busy] / offered_sums[busy]).min()) if busy.any() else 1.0


@dataclass(frozen=True)
class SimulationReport:
    """All policies' results on one trace."""

    trace: str
    requests: int
    workers: int
    slo_s: float
    latency_model: str
    tick_s: float
    window_s: float
    results: tuple[PolicyResult, ...]
    notes: tuple[str, ...] = ()
    scaling: bool = False  # the fleet's size was the policies' to change
    events: tuple[Event, ...] = ()  # declared, on the replay's clock (Unix seconds)
    origin_s: float = 0.0  # Unix time of the replay's start, the events' clock
    # The same where the replay runs on the trace's own clock (a trace with timestamps,
    # not time-scaled): plots show clock time then, hours since the start otherwise.
    clock_origin_s: float | None = None
    # The overhead outside the batcher the client account adds, in words; None: no
    # client account (the latency model carries no overhead).
    client_overhead: str | None = None


class _PolicyRun:
    """One policy's controller driving one simulated pool: each tick the pool reports
    like a live worker (one `WorkerStats` for all its workers), `observe_pool` builds
    the observation as the live control loop does, and the controller steps on it."""

    POOL = "simulated"

    def __init__(
        self,
        policy: Policy,
        pool: SimulatedPool,
        settings: SimulationSettings,
        shadow: Policy | None = None,
    ) -> None:
        self.policy = policy
        self.pool = pool
        self.settings = settings
        self.version = 1
        self.records: list[DecisionRecord] = []
        self.controller = Controller(policy, settings.controller_settings(self.POOL), shadow=shadow)
        if settings.history is not None:
            shadow_feed = self.controller.shadow.feed if self.controller.shadow else None
            for feed in filter(None, (self.controller.feed, shadow_feed)):
                feed.prime(settings.history, 0.0)
        self.timeline = TimelineBuilder(settings.window_s, settings.pool.workers)
        self.counts = [0, 0, 0, 0, 0, 0.0]  # completed shed within_slo batches size fill
        self.busy_s = 0.0
        self.latency_sum_s = 0.0
        self.latency_max_s = 0.0
        self.wall_s = 0.0
        self.window_hist = np.zeros(NUM_BUCKETS, dtype=np.int64)
        self.total_hist = np.zeros(NUM_BUCKETS, dtype=np.int64)
        self.client_hist = np.zeros(NUM_BUCKETS, dtype=np.int64)
        self.client_within_slo = 0
        self.client_latency_sum_s = 0.0
        self.max_replicas = settings.pool.workers
        self._paid_s = 0.0  # the pool's replica-seconds when the last window closed
        self.finished = False  # past the trace's end with nothing left to serve

    def tick(self, t_start: float, t_end: float, arrivals: np.ndarray) -> None:
        started = time.perf_counter()
        controller = self.controller
        stats = self.pool.advance(t_start, t_end, arrivals, controller.config)
        self._accumulate(stats)
        settings = self.settings
        fleet = self.pool.fleet(t_end) if settings.pool.fleet is not None else None
        workers = settings.pool.workers if fleet is None else max(1, fleet.ready)
        report = pool_report(self.pool, stats, t_end, settings.tick_s, self.version, workers)
        observed = observe_pool([report], t_end, settings.tick_s, workers)
        record = controller.step(t_end, observed, fleet)
        if record.changed:
            self.version += 1
        if fleet is not None and controller.replicas != fleet.provisioned:
            self.pool.resize(controller.replicas, t_end)
            self.max_replicas = max(self.max_replicas, controller.replicas)
        if record.noteworthy:
            self.records.append(replace(record, version=self.version))
        self.wall_s += time.perf_counter() - started

    def _accumulate(self, s: TickStats) -> None:
        c = self.counts
        c[0] += s.completed
        c[1] += s.shed
        c[2] += s.within_slo
        c[3] += s.batches
        c[4] += s.batch_size_sum
        c[5] += s.fill_sum
        self.busy_s += s.busy_s
        self.latency_sum_s += s.latency_sum_s
        self.latency_max_s = max(self.latency_max_s, s.latency_max_s)
        if s.completed:
            self.window_hist += self.pool.tick_histogram
            if self.pool.client_account:
                self.client_hist += self.pool.client_histogram
                self.client_within_slo += s.client_within_slo
                self.client_latency_sum_s += s.client_latency_sum_s
        self.timeline.add_tick(s)

    def run_block(self, ticks: list[_Tick]) -> None:
        per_window = self.settings.ticks_per_window
        for tick in ticks:
            if self.finished:
                return
            self.tick(tick.start_s, tick.end_s, tick.arrivals)
            if (tick.index + 1) % per_window == 0:
                self.close_window(tick.end_s)
            # Past the trace's end, a pool stops at its first idle tick, whatever the
            # other policies' pools still hold: a policy's results never depend on the
            # policies it is compared with (nor on how they are split over processes).
            if tick.final and self.idle:
                self.close_window(tick.end_s)
                self.finished = True

    def close_window(self, end_s: float) -> None:
        if self.timeline.rows and self.timeline.rows[-1].end_s >= end_s:
            return
        last = self.controller.last
        forecast = None if last is None else last.forecast
        fleet = None
        if self.settings.pool.fleet is not None:
            fleet = self.pool.fleet(end_s).provisioned, self.pool.replica_seconds - self._paid_s
            self._paid_s = self.pool.replica_seconds
        self.timeline.close_window(
            end_s,
            self.window_hist,
            self.controller.config,
            served_max_batch=self.pool.served_max_batch,
            forecast_rps=None if forecast is None else forecast.mean_rps_now,
            forecast_upper_rps=None if forecast is None else forecast.upper_rps_now,
            fallback=self.controller.mode is Mode.FALLBACK,
            replicas=None if fleet is None else fleet[0],
            replica_seconds=None if fleet is None else fleet[1],
        )
        self.total_hist += self.window_hist
        self.window_hist[:] = 0

    @property
    def idle(self) -> bool:
        return self.pool.queue_depth == 0

    def _feeds(self) -> list[ForecastFeed]:
        shadow = self.controller.shadow
        feeds = (self.controller.feed, None if shadow is None else shadow.feed)
        return [f for f in feeds if f is not None]

    def result(self, requests: int, duration_s: float) -> PolicyResult:
        completed, shed, within, batches, size_sum, fill_sum = self.counts
        histogram = LatencyHistogram()
        histogram.add_counts(self.total_hist, self.latency_sum_s, self.latency_max_s)
        span_s = max(self.pool.last_busy_s, duration_s)
        settings = self.settings.pool
        fixed = settings.fleet is None
        replica_seconds = settings.workers * span_s if fixed else self.pool.replica_seconds
        feeds = self._feeds()
        client_latency = None
        if self.pool.client_account:
            client = LatencyHistogram()
            # The kernel keeps no exact client max: the top bucket's value stands for it.
            nonzero = np.flatnonzero(self.client_hist)
            top_s = float(BUCKET_REPRESENTATIVES_S[nonzero[-1]]) if nonzero.size else 0.0
            client.add_counts(self.client_hist, self.client_latency_sum_s, top_s)
            client_latency = client.summary()
        return PolicyResult(
            policy=self.policy.spec,
            requests=requests,
            completed=int(completed),
            shed=int(shed),
            within_slo=int(within),
            latency=histogram.summary(),
            batches=int(batches),
            batch_size_sum=int(size_sum),
            fill_sum=float(fill_sum),
            busy_s=self.busy_s,
            workers=settings.workers,
            span_s=span_s,
            wall_s=self.wall_s,
            config_changes=self.controller.config_changes,
            timeline=tuple(self.timeline.rows),
            fallback_s=self.controller.fallback_s,
            fit_failures=sum(f.fit_failures for f in feeds),
            last_fit_error=next((f.last_fit_error for f in feeds if f.last_fit_error), None),
            decisions=tuple(self.records),
            clamped_from=self.pool.clamped_from,
            max_feasible_batch=self.pool.max_feasible_batch,
            safety_shed=settings.max_queue is None and shed > 0,
            records=self.pool.records() if settings.record_requests else None,
            replica_seconds=replica_seconds,
            replica_changes=self.controller.replica_changes,
            max_replicas=self.max_replicas,
            client_latency=client_latency,
            client_within_slo=self.client_within_slo if self.pool.client_account else None,
        )


def pool_report(
    pool: SimulatedPool,
    s: TickStats,
    now: float,
    tick_s: float,
    version: int,
    replicas: int | None = None,
) -> WorkerStats:
    """A simulated pool's tick as its workers would report it over the bus: one
    `WorkerStats` that covers all of them (`replicas`: those ready, on a fleet that
    scales)."""
    warm = pool.warmup_status(now)
    return WorkerStats(
        worker=_PolicyRun.POOL,
        window_s=tick_s,
        arrivals=s.arrivals,
        completed=s.completed,
        shed=s.shed,
        latency_buckets=(),
        latency_counts=pool.tick_histogram.copy() if s.completed else None,
        latency_p50_s=s.p50_s,
        latency_p99_s=s.p99_s,
        latency_sum_s=s.latency_sum_s,
        batch_sizes=(),
        busy_s=s.busy_s,
        queue_depth=s.queue_depth,
        max_batch_size=pool.served_max_batch,
        warmed_buckets=None if warm is None else warm.warmed,
        config_version=version,
        replicas=pool.settings.workers if replicas is None else replicas,
        batches=s.batches,
        batch_size_sum=s.batch_size_sum,
        fill_sum=s.fill_sum,
    )


ProgressCallback = Callable[[float], None]


def simulate(
    trace: Trace,
    policies: Sequence[Policy],
    settings: SimulationSettings,
    latency: LatencyModel,
    on_progress: ProgressCallback | None = None,
    shadows: Sequence[Policy | None] | None = None,
    processes: int | None = None,
) -> SimulationReport:
    """Replay `trace` once per policy, on the same arrivals, and summarise each.

    `shadows[i]`, when given, decides beside policy i and is only recorded. Policies
    replay in up to `processes` forked processes (None: one per usable core) when the
    trace is long enough to pay for it; the results are the same either way. A caller
    with threads of its own (a server) passes `processes=1`: a fork copies only the
    calling thread, and any lock another thread held at that instant stays held."""
    shadows = list(shadows) if shadows is not None else [None] * len(policies)
    job = _ReplayJob(trace, settings, latency, tuple(zip(policies, shadows, strict=True)))
    groups = _process_groups(job, usable_cores() if processes is None else processes)
    if len(groups) > 1:
        requests, results = _replay_in_processes(job, groups, on_progress)
    else:
        requests, results = job.replay(range(len(job.policies)), on_progress, usable_cores())
    return SimulationReport(
        trace=trace.name,
        requests=requests,
        workers=settings.pool.workers,
        slo_s=settings.pool.slo_s,
        latency_model=latency.describe(),
        client_overhead=latency.overhead.describe() if latency.overhead else None,
        tick_s=settings.tick_s,
        window_s=settings.window_s,
        results=tuple(results),
        notes=tuple(trace.notes),
        scaling=settings.pool.fleet is not None,
        events=settings.events,
        origin_s=settings.origin_s,
        clock_origin_s=settings.origin_s if settings.on_trace_clock else None,
    )


@dataclass(frozen=True)
class _ReplayJob:
    """What a replay of some of the policies needs: each group of policies, in this
    process or a forked one, draws the same arrivals and jitter from the same seeds."""

    trace: Trace
    settings: SimulationSettings
    latency: LatencyModel
    policies: tuple[tuple[Policy, Policy | None], ...]  # (policy, its shadow)

    def replay(
        self, indices: Sequence[int], on_progress: ProgressCallback | None, threads: int
    ) -> tuple[int, list[PolicyResult]]:
        settings = self.settings
        arrival_seed, jitter_seed = np.random.SeedSequence(settings.seed).spawn(2)
        stream = ArrivalStream(
            self.trace.arrival_chunks(settings.chunk_s, np.random.default_rng(arrival_seed))
        )
        runs = [
            _PolicyRun(policy, _pool(settings, self.latency, jitter_seed), settings, shadow)
            for policy, shadow in (self.policies[i] for i in indices)
        ]
        requests = _replay(stream, runs, settings, self.trace.duration_s, on_progress, threads)
        return requests, [run.result(requests, self.trace.duration_s) for run in runs]


PROCESS_MIN_TICKS = 3_600
"""Replays shorter than this (per policy) stay in one process: forking costs more."""


REPLAY_WEIGHTS = {"aimd": 1.2, "reactive": 1.6, "predictive": 3.3, "oracle": 3.6}
"""A policy's share of a replay's time by its spec's name, against static's 1 (measured
on the promo day, one thread each: static 7.7 s, aimd 9.4, reactive 12.4, predictive
25.5, oracle 27.5; a forecasting policy runs its optimiser and forecaster every tick,
reactive's small batches double the engine's work). Only balances the process groups;
results never depend on it."""


def _replay_weight(policy: Policy) -> float:
    return REPLAY_WEIGHTS.get(policy.spec.split(":", 1)[0], 1.0)


def usable_cores() -> int:
    """The cores this process may run on, where forked workers can run (1 without fork)."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def spare_core() -> bool:
    return usable_cores() > 1


ARRIVAL_WEIGHT = 0.35
"""Generating a replay's arrivals, which every process does for itself, against a static
policy's replay of them (promo day: 2.7 s against 7.3 s, one core)."""


def _process_groups(job: _ReplayJob, cores: int) -> list[list[int]]:
    """The policies' indices split into process groups for `cores` cores: as many
    groups as makes the replay shortest. The OS shares the cores between processes, so a
    replay lasts about as long as its heaviest group, or its total work over the cores,
    whichever is longer; each group also generates the arrivals for itself. Three equal
    policies on two cores thus run as three processes (the longer of 1 + 0.35 and
    (3 + 3 x 0.35) / 2 = 2.0 units), not two (2 + 0.35). One group (this process) for
    one policy, a short trace or one core."""
    ticks = job.trace.duration_s / job.settings.tick_s
    if min(len(job.policies), cores) < 2 or ticks < PROCESS_MIN_TICKS:
        return [list(range(len(job.policies)))]
    weights = [_replay_weight(policy) for policy, _ in job.policies]

    def wall(groups: list[list[int]]) -> float:
        loads = [sum(weights[i] for i in g) + ARRIVAL_WEIGHT for g in groups if g]
        return max(max(loads), sum(loads) / cores)

    fewest = min(cores, len(weights))
    candidates = [_balanced(weights, count) for count in range(fewest, len(weights) + 1)]
    best = min(candidates, key=wall)  # the fewest processes among equals: listed first
    return [sorted(group) for group in best if group]


def _balanced(weights: list[float], count: int) -> list[list[int]]:
    """Every assignment of the items to `count` groups where there are few (a handful
    of policies on a few cores), else heaviest first onto the lightest group."""
    if count >= len(weights):
        return [[i] for i in range(len(weights))]
    if count ** len(weights) <= 5_000:
        best = min(
            itertools.product(range(count), repeat=len(weights)),
            key=lambda owners: max(
                sum(w for w, o in zip(weights, owners, strict=True) if o == g) for g in range(count)
            ),
        )
        return [[i for i, o in enumerate(best) if o == g] for g in range(count)]
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for i in sorted(range(len(weights)), key=lambda i: -weights[i]):
        lightest = loads.index(min(loads))
        groups[lightest].append(i)
        loads[lightest] += weights[i]
    return groups


# A forked worker finds its job here: set just before the fork, so nothing is pickled
# on the way in (policies hold compiled tables and fitted forecasters).
_FORKED: tuple[_ReplayJob, Any] | None = None


def _replay_group(group: Sequence[int], slot: int) -> tuple[int, list[PolicyResult]]:
    assert _FORKED is not None
    job, progress = _FORKED

    def report(end_s: float) -> None:
        progress[slot] = end_s

    return job.replay(group, report, threads=1)


def _replay_in_processes(
    job: _ReplayJob, groups: list[list[int]], on_progress: ProgressCallback | None
) -> tuple[int, list[PolicyResult]]:
    """Each group in a forked process (policies are Python under the GIL: threads
    cannot run two at once); progress is the slowest group's. A failure in a group is
    raised here with its traceback."""
    global _FORKED
    context = multiprocessing.get_context("fork")
    progress = context.Array("d", len(groups), lock=False)
    _FORKED = (job, progress)
    results: list[PolicyResult | None] = [None] * len(job.policies)
    try:
        with ProcessPoolExecutor(len(groups), mp_context=context) as executor:
            futures = [executor.submit(_replay_group, g, i) for i, g in enumerate(groups)]
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=0.25)
                if on_progress is not None:
                    on_progress(min(progress))
            requests = 0
            for group, future in zip(groups, futures, strict=True):
                requests, group_results = future.result()
                for i, result in zip(group, group_results, strict=True):
                    results[i] = result
    finally:
        _FORKED = None
    assert all(r is not None for r in results)
    return requests, results  # type: ignore[return-value]


def _pool(
    settings: SimulationSettings, latency: LatencyModel, seed: np.random.SeedSequence
) -> SimulatedPool:
    # Every policy's pool draws the same jitter sequence (common random numbers).
    return SimulatedPool(settings.pool, latency, np.random.default_rng(seed))


@dataclass(frozen=True, slots=True)
class _Tick:
    index: int
    start_s: float
    end_s: float
    arrivals: np.ndarray
    final: bool  # at or past the trace's end, every arrival delivered


BLOCK_TICKS = 60
"""Ticks whose arrivals are generated together before the policies replay them in parallel."""


def _replay(
    stream: ArrivalStream,
    runs: list[_PolicyRun],
    settings: SimulationSettings,
    duration_s: float,
    on_progress: ProgressCallback | None,
    threads: int,
) -> int:
    """Feed every run the same ticks, on up to `threads` threads; returns the number of
    arrivals."""
    requests = 0
    next_tick = 0
    # The kernel releases the GIL, so policies replay a block of ticks on separate cores;
    # in a forked group (`threads=1`, a process per core already) threads only contend.
    with ThreadPoolExecutor(max_workers=min(len(runs), threads)) as executor:
        while True:
            block = _next_block(stream, settings, duration_s, next_tick)
            requests += sum(t.arrivals.size for t in block)
            next_tick += len(block)
            live = [r for r in runs if not r.finished]
            list(executor.map(_PolicyRun.run_block, live, [block] * len(live)))
            if on_progress is not None:
                on_progress(block[-1].end_s)
            if all(r.finished for r in runs):
                return requests


def _next_block(
    stream: ArrivalStream, settings: SimulationSettings, duration_s: float, first: int
) -> list[_Tick]:
    block = []
    for index in range(first, first + BLOCK_TICKS):
        start_s, end_s = index * settings.tick_s, (index + 1) * settings.tick_s
        arrivals = stream.take_until(end_s)
        final = end_s >= duration_s and stream.drained
        block.append(_Tick(index, start_s, end_s, arrivals, final))
        if final:
            break
    return block
