"""Control plane: how long a control tick takes, and how fast a new config reaches workers.

On a private redis-server (started here on a free port, no disk):

1. Tick time. The real `ControlLoop` around the real `Controller` (policies `reactive`
   and `predictive`, 1 s tick, SLO 100 ms, `linear:5,0.4`), with 16 workers reporting
   every second from another process; baseline: the same tick with 1 worker. Each
   tick's wall time is what the loop itself records (`state.last_tick_s`).
2. Config propagation. The leader's `RedisBus.publish_config` of a newer version, until
   all 16 `WorkerLink`-attached `DynamicBatcher`s (another process) run it; baseline in
   the same run: 16 batchers that poll the config hash every second instead.
3. Long history. What a tick costs when it trims a full `history_s` (8 days) of
   per-second arrivals, and what reading 6 h of it back (a restart's forecast priming)
   costs: both happen in the live control plane, neither in a 60 s run.

Targets (issue 6): tick p99 under 20 ms; propagation p99 under 100 ms on loopback.

    PYTHONPATH=. python benchmarks/control_plane.py [--seconds 60] [--baseline-seconds 15]
        [--changes 200] [--history-days 8]

Prints readable tables; the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import multiprocessing as mp
import queue
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path
from typing import Any

import numpy as np
from redis.exceptions import RedisError

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.config import BatchConfig
from adaptive.controller import Controller, ControllerSettings
from adaptive.histogram import LatencyHistogram
from adaptive.latency import parse_latency_model
from adaptive.optimizer import PerformanceTable
from adaptive.specs import PolicyContext, build_policy
from server.bus.redis_bus import RedisBus, connect
from server.control.loop import ControlLoop
from server.worker.batching import DynamicBatcher
from server.worker.link import WorkerLink
from server.worker.reporter import apply_if_newer
from simulations.calibration import performance_table
from simulations.engine import Routing

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 16
SLO_S = 0.1
TICK_S = 1.0
LATENCY = parse_latency_model("linear:5,0.4")
RATE_PER_WORKER_RPS = 500.0
REPORT_INTERVAL_S = 1.0
HEARTBEAT_TTL_S = 3.0
WARM_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
POLICIES = ("reactive", "predictive")
PRIMED_HISTORY_S = 6 * 3600
POLL_INTERVAL_S = 1.0
TRICKLE_RPS = 5.0
PAUSE_S = (0.01, 0.04)
CHANGE_CONFIGS = (
    BatchConfig(8, 0.002),
    BatchConfig(16, 0.001),
    BatchConfig(32, 0.002),
    BatchConfig(64, 0.005),
    BatchConfig(16, 0.0),
)
TICK_TARGET_P99_MS = 20.0
PROPAGATION_TARGET_P99_MS = 100.0
# Python's time.monotonic() is CLOCK_MONOTONIC, one clock for every process on a Linux
# machine: the publisher's and the workers' timestamps can be subtracted.
now_s = time.monotonic


def redis_process(*extra: str):
    """The tests' private redis-server (free port, no disk): one way to start it."""
    sys.path.insert(0, str(ROOT / "tests"))
    from redis_server import RedisProcess

    return RedisProcess(*extra)


def processes() -> mp.context.BaseContext:
    """Fork: a spawned child re-imports this module (torch and statsmodels come with
    `server.worker.batching` and the forecasters), 4-6 s a process; a forked one starts at once.
    Nothing runs in this process when it forks (no event loop, no Python threads)."""
    return mp.get_context("fork")


def quantiles_ms(seconds: np.ndarray) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    return {
        "p50": round(float(np.quantile(ms, 0.5)), 3),
        "p99": round(float(np.quantile(ms, 0.99)), 3),
        "max": round(float(ms.max()), 3),
    }


# -- 1. tick time: a pool of reporting workers in another process ----------------------
#
# The reporters publish realistic `WorkerStats` and heartbeats straight through
# `RedisBus` (what `WorkerLink._report_loop` does each second) instead of running 16
# batchers: the tick reads only what lands in Redis, so this is the same input, and it
# leaves the two cores to the controller and redis-server. They run in their own process
# so the measured tick is the controller's own, not time spent serving reporters that
# share its event loop.


@dataclass
class ConfigInForce:
    """The pool's config as the reporters last read it (their stats follow it)."""

    current: VersionedConfig


def synthetic_stats(
    worker: str, config: VersionedConfig, rate_rps: float, rng: np.random.Generator
) -> WorkerStats:
    """One second of a worker serving Poisson load under `config` with `LATENCY`."""
    cap, timeout_s = config.config.max_batch_size, config.config.timeout_s
    arrivals = int(rng.poisson(rate_rps))
    size = int(min(cap, max(1, round(1 + rate_rps * timeout_s))))  # what a timeout gathers
    full, rest = divmod(arrivals, size)
    sizes = {s: n for s, n in ((size, full), (rest, 1)) if s and n}
    service_s = {s: float(LATENCY.mean_s(np.array([s]))[0]) for s in sizes}
    waits_s = rng.uniform(0.0, min(timeout_s, size / rate_rps), arrivals)
    latencies_s = waits_s + service_s.get(size, service_s.get(rest, 0.0))
    histogram = LatencyHistogram.from_samples(latencies_s)
    nonzero = np.flatnonzero(histogram.counts)
    return WorkerStats(
        worker=worker,
        window_s=REPORT_INTERVAL_S,
        arrivals=arrivals,
        completed=arrivals,
        shed=0,
        latency_buckets=tuple((int(i), int(histogram.counts[i])) for i in nonzero),
        latency_sum_s=histogram.sum_s,
        batch_sizes=tuple(sorted(sizes.items())),
        busy_s=sum(n * service_s[s] for s, n in sizes.items()),
        queue_depth=int(rng.integers(0, size)),
        max_batch_size=cap,
        warmed_buckets=WARM_BUCKETS,
        config_version=config.version,
    )


async def follow_config(bus: RedisBus, pool: str, held: ConfigInForce, stop: ProcessEvent):
    while not stop.is_set():
        held.current = await bus.current_config(pool) or held.current
        await asyncio.sleep(REPORT_INTERVAL_S)


async def report_as(
    bus: RedisBus,
    pool: str,
    worker: str,
    held: ConfigInForce,
    rng: np.random.Generator,
    stop: ProcessEvent,
) -> None:
    """A worker's report loop: stats, then heartbeat, every second (as `WorkerLink`)."""
    await asyncio.sleep(rng.uniform(0.0, REPORT_INTERVAL_S))  # workers start at any phase
    while not stop.is_set():
        stats = synthetic_stats(worker, held.current, RATE_PER_WORKER_RPS, rng)
        await bus.publish_worker_stats(pool, stats)
        info = {"time": time.time(), "config_version": held.current.version}
        await bus.heartbeat(pool, worker, info, HEARTBEAT_TTL_S)
        await asyncio.sleep(REPORT_INTERVAL_S)


async def report_pool(
    url: str, pool: str, workers: int, seed: int, ready: ProcessEvent, stop: ProcessEvent
) -> None:
    bus = RedisBus(connect(url))
    held = ConfigInForce(VersionedConfig(0, BatchConfig(8, 0.005)))
    rngs = np.random.default_rng(seed).spawn(workers)
    tasks = [asyncio.create_task(follow_config(bus, pool, held, stop))]
    tasks += [
        asyncio.create_task(report_as(bus, pool, f"w{i}", held, rngs[i], stop))
        for i in range(workers)
    ]
    await asyncio.sleep(REPORT_INTERVAL_S * 1.2)  # every worker has beaten once
    ready.set()
    await asyncio.gather(*tasks)
    await bus.client.aclose()


def reporters_process(
    url: str, pool: str, workers: int, seed: int, ready: ProcessEvent, stop: ProcessEvent
) -> None:
    asyncio.run(report_pool(url, pool, workers, seed, ready, stop))


# -- 1. tick time: the controller, in this process -------------------------------------


@dataclass(frozen=True)
class TickRun:
    policy: str
    workers: int
    first_tick_s: float
    ticks_s: np.ndarray  # every tick after the first
    cpu_per_tick_s: float
    publishing_ticks: int
    min_workers_alive: int
    mode: str
    final_config: str

    def figures(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "workers": self.workers,
            "ticks": int(self.ticks_s.size),
            "tick_ms": quantiles_ms(self.ticks_s),
            "first_tick_ms": round(self.first_tick_s * 1e3, 3),
            "cpu_ms_per_tick": round(self.cpu_per_tick_s * 1e3, 3),
            "publishing_ticks": self.publishing_ticks,
            "min_workers_alive": self.min_workers_alive,
            "mode": self.mode,
            "final_config": self.final_config,
        }


def table_for(workers: int) -> Callable[[float], PerformanceTable]:
    """The optimiser's table as `server.control.plane.PoolControl` builds it (no warm-up,
    so batches are not padded; round-robin routing, the live default)."""
    return lambda slo_s: performance_table(LATENCY, workers, slo_s, False, Routing.ROUND_ROBIN)


def build_controller(policy: str, workers: int, pool: str) -> Controller:
    context = PolicyContext(SLO_S, workers, table=table_for(workers))
    settings = ControllerSettings(
        pool=pool, slo_s=SLO_S, tick_s=TICK_S, workers=workers, origin_s=time.time()
    )
    return Controller(build_policy(policy, context), settings)


def prime_forecast(controller: Controller, workers: int, seed: int) -> float:
    """Give a forecasting controller 6 h of steady traffic, as a restart primes it from
    the bus (`PoolControl._prime`), so the measured ticks run the fitted model, not the
    30-minute last-value stand-in. Returns the seconds it took: one fit and predict,
    which is also what the tick that refits (every 30 minutes) adds."""
    if controller.feed is None:
        return 0.0
    rng = np.random.default_rng(seed)
    counts = rng.poisson(RATE_PER_WORKER_RPS * workers, PRIMED_HISTORY_S).astype(np.float64)
    started = time.perf_counter()
    controller.feed.prime(counts, 0.0)  # the loop's clock starts at zero
    return time.perf_counter() - started


async def stop_task(task: asyncio.Task) -> None:
    # redis-py may swallow one cancellation mid-command: cancel until it is done.
    while not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task}, timeout=1.0)


async def measure_ticks(url: str, controller: Controller, ticks: int) -> TickRun:
    bus = RedisBus(connect(url))
    durations: list[float] = []
    alive: list[int] = []
    published: list[int] = [0]
    done = asyncio.Event()

    def observe(loop: ControlLoop, _record: object) -> None:
        durations.append(loop.state.last_tick_s)
        alive.append(loop.state.workers_alive)
        published.append(loop.state.published_version)
        if len(durations) > ticks:
            done.set()

    loop = ControlLoop(controller, bus, "bench-controller", observer=observe)
    cpu_started = time.process_time()
    running = asyncio.create_task(loop.run())
    await done.wait()
    cpu_s = time.process_time() - cpu_started
    await stop_task(running)
    await bus.client.aclose()
    return TickRun(
        policy=controller.policy.spec,
        workers=controller.settings.workers,
        first_tick_s=durations[0],
        ticks_s=np.array(durations[1:]),
        cpu_per_tick_s=cpu_s / len(durations),
        publishing_ticks=int(np.count_nonzero(np.diff(published[1:]))),
        min_workers_alive=min(alive[1:]),
        mode=controller.mode.value,
        final_config=controller.config.describe(),
    )


def tick_run(url: str, policy: str, workers: int, seconds: float, seed: int) -> TickRun:
    pool = f"tick-{policy}-{workers}"
    controller = build_controller(policy, workers, pool)
    prime_forecast(controller, workers, seed)
    ctx = processes()
    ready, stop = ctx.Event(), ctx.Event()
    reporters = ctx.Process(
        target=reporters_process, args=(url, pool, workers, seed, ready, stop), daemon=True
    )
    reporters.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the reporter process did not start")
        return asyncio.run(measure_ticks(url, controller, round(seconds / TICK_S)))
    finally:
        stop.set()
        reporters.join(10)


def policy_costs(seed: int) -> dict[str, float]:
    """What `predictive` costs besides the measured ticks: compiling the optimiser's table
    (once, before the loop starts) and one forecast refit (inside one tick in 1,800)."""
    started = time.perf_counter()
    controller = build_controller("predictive", WORKERS, "compile")
    compile_s = time.perf_counter() - started
    return {
        "table_compile_s": round(compile_s, 3),
        "forecast_refit_ms": round(prime_forecast(controller, WORKERS, seed) * 1e3, 3),
    }


# -- 2. config propagation: a fleet of workers in another process ----------------------
#
# Real `WorkerLink`s (pub/sub notice, then a read of the config hash) over real
# `DynamicBatcher`s serving a trickle of requests, in a process of their own so the
# publisher's timing is not theirs. The 16 share that process's event loop, so their 16
# notices are handled one after another where 16 machines would handle them at once:
# the time until the last one runs it is, if anything, overstated. The baseline's 16
# batchers poll the hash every second from the same process, at random phases.


class FakeModel:
    """A model that takes a millisecond and warms at once (the shell is under test)."""

    def run(self, inputs: list[Any], padded_size: int) -> list[Any]:
        time.sleep(0.001)
        return list(inputs)

    def warm(self, size: int) -> float:
        return 0.001


Applied = tuple[str, int, int, float]  # how (push or poll), worker index, version, at


class TimedBatcher(DynamicBatcher):
    """A `DynamicBatcher` that notes the instant it starts running each config version."""

    def __init__(self, on_apply: Callable[[int, float], None]) -> None:
        super().__init__(FakeModel(), CHANGE_CONFIGS[0], warm_at_start=False)
        self.on_apply = on_apply

    def reconfigure(self, config: BatchConfig, version: int | None = None) -> None:
        super().reconfigure(config, version)
        if version is not None:
            self.on_apply(version, now_s())


async def trickle(batcher: DynamicBatcher, rate_rps: float, rng: np.random.Generator) -> None:
    """Poisson requests, so every batcher is serving while its config changes."""
    pending: set[asyncio.Task] = set()
    for i in itertools.count():
        await asyncio.sleep(rng.exponential(1 / rate_rps))
        task = asyncio.create_task(batcher.submit(i))
        pending.add(task)
        task.add_done_callback(pending.discard)


async def poll_config(batcher: DynamicBatcher, bus: RedisBus, pool: str, phase_s: float):
    """The baseline: a worker without pub/sub reads the config hash every second."""
    await asyncio.sleep(phase_s)
    while True:
        apply_if_newer(batcher, await bus.current_config(pool))
        await asyncio.sleep(POLL_INTERVAL_S)


async def until(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = now_s() + timeout_s
    while not condition():
        if now_s() > deadline:
            raise RuntimeError("the worker fleet did not come up")
        await asyncio.sleep(0.01)


async def run_fleet(
    url: str, pool: str, workers: int, seed: int, acks: mp.Queue, stop: ProcessEvent
) -> list[Applied]:
    """`workers` batchers on `WorkerLink`s and `workers` polling ones, until `stop`."""
    bus = RedisBus(connect(url))
    applied: list[Applied] = []

    def noter(how: str, index: int) -> Callable[[int, float], None]:
        def note(version: int, at: float) -> None:
            applied.append((how, index, version, at))
            if how == "push":
                acks.put(version)  # paces the publisher; the timestamp is `at`

        return note

    pushed = [TimedBatcher(noter("push", i)) for i in range(workers)]
    polled = [TimedBatcher(noter("poll", i)) for i in range(workers)]
    for batcher in pushed + polled:
        await batcher.start()
    links = [WorkerLink(b, bus, pool, f"worker-{i}") for i, b in enumerate(pushed)]
    for link in links:
        # Workers on their own machines start at unrelated instants; started together,
        # all 16 report loops would wake in the same millisecond every second.
        link.start()
        await asyncio.sleep(REPORT_INTERVAL_S / workers)
    rng = np.random.default_rng(seed)
    streams = rng.spawn(2 * workers)
    tasks = [asyncio.create_task(poll_config(b, bus, pool, rng.uniform())) for b in polled]
    tasks += [
        asyncio.create_task(trickle(b, TRICKLE_RPS, s))
        for b, s in zip(pushed + polled, streams, strict=True)
    ]
    await until(lambda: all(link.connected for link in links), 10)
    await until(lambda: all(b.version >= 1 for b in pushed + polled), 10)
    acks.put(0)  # ready
    while not stop.is_set():
        await asyncio.sleep(0.05)
    await shut_fleet(tasks, links, pushed + polled)
    await bus.client.aclose()
    return applied


async def shut_fleet(
    tasks: list[asyncio.Task], links: list[WorkerLink], batchers: list[DynamicBatcher]
) -> None:
    for task in tasks:
        await stop_task(task)
    for link in links:
        await link.stop()
    for batcher in batchers:
        await batcher.drain()


def fleet_process(
    url: str,
    pool: str,
    workers: int,
    seed: int,
    acks: mp.Queue,
    results: mp.Queue,
    stop: ProcessEvent,
) -> None:
    results.put(asyncio.run(run_fleet(url, pool, workers, seed, acks, stop)))


def wait_for_acks(acks: mp.Queue, version: int, count: int, timeout_s: float = 10.0) -> None:
    """Block until `count` pushed workers report running `version`."""
    seen, deadline = 0, now_s() + timeout_s
    while seen < count:
        try:
            seen += acks.get(timeout=max(0.0, deadline - now_s())) == version
        except queue.Empty:
            raise RuntimeError(f"{seen} of {count} workers ran version {version}") from None


async def publish_changes(
    url: str, pool: str, changes: int, workers: int, acks: mp.Queue, seed: int
) -> tuple[dict[int, float], list[float]]:
    """Publish `changes` + 1 newer configs, each once every pushed worker runs the last
    (the first opens the leader's connection and loads its script: reported apart).
    Returns when each version was published, and each publish call's round trip."""
    bus = RedisBus(connect(url))
    rng = np.random.default_rng(seed)
    published: dict[int, float] = {}
    round_trips: list[float] = []
    for version in range(2, changes + 3):
        config = VersionedConfig(version, CHANGE_CONFIGS[version % len(CHANGE_CONFIGS)])
        published[version] = now_s()
        await bus.publish_config(pool, config)
        round_trips.append(now_s() - published[version])
        await asyncio.to_thread(wait_for_acks, acks, version, workers)
        await asyncio.sleep(rng.uniform(*PAUSE_S))
    await asyncio.sleep(POLL_INTERVAL_S * 1.5)  # every poller reads the last one too
    await bus.client.aclose()
    return published, round_trips


def all_running_s(published: dict[int, float], applied: list[Applied], how: str) -> np.ndarray:
    """For each version: from its publication until every worker of `how` ran it (or a
    newer one, which a poller may read first)."""
    workers = sorted({index for h, index, _, _ in applied if h == how})
    versions = np.array(sorted(published))
    latest = np.full(versions.size, -np.inf)
    for index in workers:
        mine = sorted((v, at) for h, i, v, at in applied if h == how and i == index)
        ran = np.array([v for v, _ in mine])
        at = np.array([at for _, at in mine])
        latest = np.maximum(latest, at[np.searchsorted(ran, versions)])
    return latest - np.array([published[v] for v in versions])


async def seed_config(url: str, pool: str) -> None:
    bus = RedisBus(connect(url))
    await bus.publish_config(pool, VersionedConfig(1, CHANGE_CONFIGS[0]))
    await bus.client.aclose()


def propagation(url: str, changes: int, seed: int) -> dict[str, Any]:
    pool = "propagation"
    asyncio.run(seed_config(url, pool))
    ctx = processes()
    acks, results, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    fleet = ctx.Process(
        target=fleet_process, args=(url, pool, WORKERS, seed, acks, results, stop), daemon=True
    )
    fleet.start()
    try:
        wait_for_acks(acks, 0, 1, timeout_s=60)
        published, round_trips = asyncio.run(
            publish_changes(url, pool, changes, WORKERS, acks, seed)
        )
    finally:
        stop.set()
    applied = results.get(timeout=60)
    fleet.join(10)
    pushed = all_running_s(published, applied, "push")
    return {
        "changes": changes,
        "workers": WORKERS,
        "pubsub_ms": quantiles_ms(pushed[1:]),
        "poll_1s_ms": quantiles_ms(all_running_s(published, applied, "poll")[1:]),
        "publish_call_ms": quantiles_ms(np.array(round_trips[1:])),
        "first_change_ms": round(float(pushed[0]) * 1e3, 3),
        "first_publish_call_ms": round(round_trips[0] * 1e3, 3),
    }


# -- 3. long history: the trim and the priming read at steady state --------------------


async def fill_history(bus: RedisBus, pool: str, seconds: int, until_s: int) -> None:
    """What `seconds` of workers' reports leave on the bus, written an hour at a time."""
    first = until_s - seconds
    for hour in range(first // 3600, (until_s - 1) // 3600 + 1):
        fields = {
            str(s): int(RATE_PER_WORKER_RPS)
            for s in range(max(first, hour * 3600), min(until_s, (hour + 1) * 3600))
        }
        await bus.client.hset(bus.arrivals_key(pool, hour), mapping=fields)


async def timed(call: Awaitable[Any]) -> tuple[float, str | None]:
    started = time.perf_counter()
    try:
        await call
    except RedisError as error:
        return time.perf_counter() - started, f"{type(error).__name__}: {error}"
    return time.perf_counter() - started, None


async def history_costs(url: str, days: float) -> dict[str, Any]:
    """One trimming tick (the loop trims on its first tick, then every 600) and one
    priming read, over `days` of per-second arrivals (the bus keeps 8 days)."""
    pool, now = "history", int(time.time())
    bus = RedisBus(connect(url))
    await fill_history(bus, pool, int(days * 86_400), now)
    controller = build_controller("reactive", 1, pool)
    loop = ControlLoop(controller, bus, "bench-controller")
    await loop.tick()
    trim_tick_s = loop.state.last_tick_s
    await loop.tick()
    plain_tick_s = loop.state.last_tick_s
    read_s, read_error = await timed(bus.arrivals_per_second(pool, now - PRIMED_HISTORY_S, now))
    await bus.client.aclose()
    return {
        "days": days,
        "fields": int(days * 86_400),
        "trimming_tick_ms": round(trim_tick_s * 1e3, 1),
        "next_tick_ms": round(plain_tick_s * 1e3, 3),
        "priming_read_ms": round(read_s * 1e3, 1),
        "priming_read_error": read_error,
    }


# -- the report --------------------------------------------------------------------------


def ratio(a: float, b: float) -> float:
    return round(a / b, 2) if b > 0 else float("inf")


def tick_table(runs: list[TickRun]) -> list[str]:
    lines = [
        "| policy | workers | ticks | p50 ms | p99 ms | max ms | first tick ms "
        "| CPU ms / tick | ticks that published |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        f = run.figures()
        t = f["tick_ms"]
        lines.append(
            f"| {run.policy} | {run.workers} | {f['ticks']} | {t['p50']:.2f} | {t['p99']:.2f} "
            f"| {t['max']:.2f} | {f['first_tick_ms']:.2f} | {f['cpu_ms_per_tick']:.2f} "
            f"| {f['publishing_ticks']} |"
        )
    return lines


def propagation_table(figures: dict[str, Any]) -> list[str]:
    rows = (
        ("pub/sub (`WorkerLink`)", figures["pubsub_ms"]),
        ("poll the hash every 1 s (baseline)", figures["poll_1s_ms"]),
        ("the publish call itself", figures["publish_call_ms"]),
    )
    lines = ["| until all 16 run it | p50 ms | p99 ms | max ms |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {name} | {q['p50']:.2f} | {q['p99']:.2f} | {q['max']:.2f} |" for name, q in rows]
    return lines


def verdicts(runs: list[TickRun], prop: dict[str, Any]) -> dict[str, Any]:
    by = {(r.policy.split(":")[0], r.workers): r.figures()["tick_ms"] for r in runs}
    worst_tick_p99 = max(by[(p, WORKERS)]["p99"] for p in POLICIES)
    push, poll = prop["pubsub_ms"], prop["poll_1s_ms"]
    return {
        "tick_p99_ms_worst_policy": worst_tick_p99,
        "meets_tick_p99_under_20ms": worst_tick_p99 < TICK_TARGET_P99_MS,
        "tick_p99_ratio_16_vs_1": {
            p: ratio(by[(p, WORKERS)]["p99"], by[(p, 1)]["p99"]) for p in POLICIES
        },
        "tick_p50_ratio_16_vs_1": {
            p: ratio(by[(p, WORKERS)]["p50"], by[(p, 1)]["p50"]) for p in POLICIES
        },
        "meets_propagation_p99_under_100ms": push["p99"] < PROPAGATION_TARGET_P99_MS,
        "poll_over_pubsub_p50": ratio(poll["p50"], push["p50"]),
        "poll_over_pubsub_p99": ratio(poll["p99"], push["p99"]),
    }


def print_ticks(figures: dict[str, Any], runs: list[TickRun]) -> None:
    settings = figures["settings"]
    print(
        f"Control tick: 1 s tick, {settings['seconds']:.0f} s with {WORKERS} workers, "
        f"{settings['baseline_seconds']:.0f} s with 1 (quantiles exclude the first tick)"
    )
    print("\n".join(tick_table(runs)))
    costs = figures["policy_costs"]
    print(
        f"predictive: table compile {costs['table_compile_s']:.1f} s (once, before the loop); "
        f"forecast refit {costs['forecast_refit_ms']:.0f} ms (inside one tick every 30 min)"
    )


def print_history(history: dict[str, Any] | None) -> None:
    if not history:
        return
    error = history["priming_read_error"]
    print(
        f"\nLong history ({history['days']:g} days, {history['fields']:,} seconds): "
        f"trimming tick {history['trimming_tick_ms']:,.0f} ms, next tick "
        f"{history['next_tick_ms']:.1f} ms; priming read {history['priming_read_ms']:,.0f} ms"
        + (f" ({error})" if error else "")
    )


def print_verdicts(figures: dict[str, Any]) -> None:
    v = figures["verdicts"]
    print(
        f"\ntick p99 < 20 ms: {'met' if v['meets_tick_p99_under_20ms'] else 'MISSED'} "
        f"({v['tick_p99_ms_worst_policy']:.2f} ms, worst policy); propagation p99 < 100 ms: "
        f"{'met' if v['meets_propagation_p99_under_100ms'] else 'MISSED'}; polling is "
        f"{v['poll_over_pubsub_p50']}x slower at p50; {figures['wall_s']:.0f} s wall"
    )


def report(figures: dict[str, Any], runs: list[TickRun]) -> None:
    print_ticks(figures, runs)
    prop = figures["propagation"]
    print(
        f"\nConfig propagation: {prop['changes']} changes after a first one "
        f"({prop['first_change_ms']:.1f} ms: connections still cold)"
    )
    print("\n".join(propagation_table(prop)))
    print_history(figures["history"])
    print_verdicts(figures)


class Phases:
    """Wall seconds per phase, so a slow run says where its time went."""

    def __init__(self) -> None:
        self.wall_s: dict[str, float] = {}

    def run(self, name: str, step: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return step()
        finally:
            self.wall_s[name] = round(time.perf_counter() - started, 1)


def measure(url: str, args: argparse.Namespace, phases: Phases) -> dict[str, Any]:
    costs = phases.run("policy_costs", lambda: policy_costs(args.seed))
    runs = [
        phases.run(
            f"ticks_{policy}_{workers}",
            lambda p=policy, w=workers, s=seconds: tick_run(url, p, w, s, args.seed),
        )
        for policy in POLICIES
        for workers, seconds in ((WORKERS, args.seconds), (1, args.baseline_seconds))
    ]
    prop = phases.run("propagation", lambda: propagation(url, args.changes, args.seed))
    days = args.history_days
    history = phases.run("history", lambda: asyncio.run(history_costs(url, days)) if days else None)
    return {"runs": runs, "costs": costs, "propagation": prop, "history": history}


def run_all(args: argparse.Namespace) -> tuple[dict[str, Any], list[TickRun]]:
    phases = Phases()
    server = redis_process()
    server.start()
    try:
        measured = measure(server.url, args, phases)
    finally:
        server.stop()
    runs = measured["runs"]
    figures = {
        "settings": {
            "seconds": args.seconds,
            "baseline_seconds": args.baseline_seconds,
            "tick_s": TICK_S,
            "rate_per_worker_rps": RATE_PER_WORKER_RPS,
            "latency": LATENCY.describe(),
            "slo_ms": SLO_S * 1e3,
        },
        "ticks": [run.figures() for run in runs],
        "policy_costs": measured["costs"],
        "propagation": measured["propagation"],
        "history": measured["history"],
        "verdicts": verdicts(runs, measured["propagation"]),
        "phase_wall_s": phases.wall_s,
        "wall_s": round(sum(phases.wall_s.values()), 1),
    }
    return figures, runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="tick run with 16 workers")
    parser.add_argument("--baseline-seconds", type=float, default=15.0, help="with 1 worker")
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--history-days", type=float, default=8.0, help="0 skips it")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    figures, runs = run_all(args)
    report(figures, runs)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
