"""One pool's live control loop: worker stats from the bus, the control step, configs out.

Each tick: renew (or take) the leader lease, read the workers' stats that arrived since
the last tick, build the observation with `adaptive.bus.observe_pool` (the simulator's
function), step the pool's `Controller` (the simulator's class), and, as leader, publish
the config it chose under a new version and log the decision. Versions belong to this
shell: a leader publishes above the highest version stored or running on any worker,
so versions never go backwards across a failover or a Redis that lost its data, and it
re-checks its lease right before every publish, so a controller that lost the lease
while it stepped never writes.

Forecast refits (the policy's and its shadow's), and rebuilds of the planner's table when
the latency learned from serving drifts, are jobs the controller hands out
(`Controller.take_jobs`): the loop runs each on a thread (`asyncio.to_thread`), keyed to
the controller that asked, and gives the outcome back to that controller only; a job
whose controller was replaced meanwhile (a policy switch, a promotion) is dropped. The
tick itself stays in milliseconds. A failed job is logged with its traceback and counted
(`LoopState.job_failures`), and the controller retries it after a backoff: a fit that
fails never wedges the forecast. Every failure is loud: a tick that fails is logged
with its traceback, counted by stage (`LoopState.errors`, exported as
`tidal_controller_tick_errors_total`), marks the pool not ready with the error shown in
/readyz and the pool's status, and the loop backs off and retries; it never ends
silently. Workers meanwhile keep their config (fail-static).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import RedisError

from adaptive.bus import VersionedConfig, WorkerStats, observe_pool
from adaptive.clock import Clock
from adaptive.config import BatchConfig
from adaptive.controller import Controller, ControllerJob
from adaptive.decisions import DecisionRecord
from adaptive.fleet import FleetView
from adaptive.forecast_feed import FitFailed
from server.bus.protocols import PoolBus
from server.clock import LoopClock
from server.control.timeline import Timeline, smallest_serving_cap

log = logging.getLogger("tidal.controller")

TRIM_EVERY_TICKS = 600
MAX_BACKOFF_S = 10.0


@dataclass
class LoopState:
    """What the API and metrics report about the loop."""

    leader: bool = False
    ready: bool = False
    ticks: int = 0
    version: int = 0  # of the config in force, as this controller knows it
    published_version: int = 0  # the last version this controller published
    workers_alive: int = 0
    workers_ready: int = 0  # alive and ready: warm, dispatching (see `member_ready`)
    # Members alive but not ready, by name: why (warming up, the dispatch loop died).
    not_ready: dict[str, str] = field(default_factory=dict)
    last_tick_s: float = 0.0
    last_error: str | None = None
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    malformed_stats: int = 0
    refits: int = 0
    replans: int = 0  # planner's tables rebuilt for the latency learned from serving
    # Background jobs that failed, by kind ("refit", "replan"), and the last one's error.
    job_failures: collections.Counter[str] = field(default_factory=collections.Counter)
    last_job_error: str | None = None
    jobs_dropped: int = 0  # finished after their controller was replaced: never installed
    # Members whose engine refused a config newer than the one it runs (it keeps
    # serving the old one), by name: {"version", "config", "reason"}.
    refusing: dict[str, dict[str, Any]] = field(default_factory=dict)
    engines: collections.Counter[str] = field(default_factory=collections.Counter)
    # Engines whose members reload for longer than the plan's --reload: kind -> seconds.
    unplanned_reloads: dict[str, float] = field(default_factory=dict)


def member_ready(info: dict[str, Any]) -> bool:
    """Whether a member's heartbeat says it is ready; one that does not say (an older
    release, an engine that does not report readiness) counts as ready."""
    return info.get("ready", True) is not False


class TickFailed(Exception):
    """A tick failed at `stage`; the cause is chained. `run` catches it, logs it, counts
    it by stage and backs off, and ticks on.

    Not a `TidalError`: it wraps whatever the stage raised, a bug included, only to name
    the stage; the cause says whether Tidal raised it on purpose."""

    def __init__(self, stage: str, cause: BaseException) -> None:
        super().__init__(f"{stage}: {cause!r}")
        self.stage = stage


TickObserver = Callable[["ControlLoop", DecisionRecord | None], None]
JobRunner = Callable[[ControllerJob], Awaitable[object]]
"""Runs a controller's job off the event loop and returns its outcome (or raises)."""
SettingsSync = Callable[[bool], Awaitable[None]]


class ControlLoop:
    def __init__(
        self,
        controller: Controller,
        bus: PoolBus,
        holder: str,
        lease_s: float = 3.0,
        observer: TickObserver | None = None,
        sync_settings: SettingsSync | None = None,
        clock: Clock | None = None,
        run_job: JobRunner | None = None,
    ) -> None:
        self.controller = controller
        self.bus = bus
        self.pool = controller.settings.pool
        self.holder = holder
        self.lease_s = lease_s
        self.observer = observer
        self.clock = clock or LoopClock()
        self._run_job = run_job or _on_a_thread
        # Operators' settings live on the bus: standbys follow them every tick, a new
        # leader takes them (or restores them to a bus that lost them) before it acts.
        self.sync_settings = sync_settings
        self.state = LoopState()
        self.latest: dict[str, WorkerStats] = {}  # each worker's last report
        # The highest config version seen stored or running on a worker: a leader's next
        # version goes above it, even when Redis lost what it stored (workers apply only
        # newer versions, so publishing below what they run would be ignored).
        self._seen_version = 0
        self._published: BatchConfig | None = None
        self._published_replicas: int | None = None
        self._cursor = "$"  # only stats that arrive from now on
        # Jobs in flight, each with the controller that asked for it.
        self._jobs: dict[asyncio.Task, tuple[Controller, ControllerJob]] = {}
        self._replicas = 0
        self._replicas_ready = 0
        self._said_infeasible = False
        # Every tick with news, for the console's charts (six hours at this tick).
        self.timeline = Timeline(capacity=max(60, round(6 * 3600 / controller.settings.tick_s)))

    async def run(self) -> None:
        """Tick every `settings.tick_s` until cancelled; failures back off, never end it."""
        tick_s = self.controller.settings.tick_s
        failures = 0
        while True:
            started = self.clock.now()
            try:
                await self.tick()
                failures = 0
            except TickFailed as failure:
                failures += 1
                self._failed(failure)
                await asyncio.sleep(min(tick_s * 2**failures, MAX_BACKOFF_S))
                continue
            await asyncio.sleep(max(0.0, tick_s - (self.clock.now() - started)))

    async def tick(self) -> None:
        """One tick; raises `TickFailed` naming the stage that failed."""
        started = time.perf_counter()
        await _stage("elect", self._elect())
        reports = await _stage("read", self._read())
        record = None
        if reports:
            record = _step(
                self.controller, reports, self.clock.now(), self._replicas, self._replicas_ready
            )
            self._say_if_infeasible(record)
            self.timeline.record(time.time(), record, smallest_serving_cap(self.latest))
        self._run_jobs()
        if self.state.leader:
            await _stage("publish", self.publish_if_changed())
            if record is not None and record.noteworthy:
                await _stage("record", self._record(record))
            if self.state.ticks % TRIM_EVERY_TICKS == 0:
                await _stage("trim", self.bus.trim_history(self.pool, int(time.time())))
        self.state.ready = True
        self.state.last_error = None
        self.state.ticks += 1
        self.state.last_tick_s = time.perf_counter() - started
        if self.observer is not None:
            self.observer(self, record)

    def _say_if_infeasible(self, record: DecisionRecord) -> None:
        """Once when the policy starts predicting that no config meets the SLO, once
        when it stops: the state itself is in the API and a gauge."""
        infeasible = self.controller.slo_infeasible_since is not None
        if infeasible == self._said_infeasible:
            return
        self._said_infeasible = infeasible
        rate = record.planned_rate_rps
        load = f" at {rate:.0f} req/s" if rate is not None else ""
        if infeasible:
            p99 = record.predicted_p99_s
            best = f", predicted p99 {p99 * 1e3:.0f} ms" if p99 is not None else ""
            log.warning(
                "%s: no config is predicted to meet the SLO of %.0f ms%s; holding the best "
                "predicted (%s%s) until one is: add capacity or relax the SLO",
                self.pool,
                self.controller.settings.slo_s * 1e3,
                load,
                record.chosen.describe(),
                best,
            )
        else:
            log.info("%s: a config is predicted to meet the SLO again%s", self.pool, load)

    async def publish_if_changed(self) -> None:
        """As leader, publish the controller's config, and on a fleet that scales its
        desired replica count, where either differs from what this controller last
        published (a decision, a pin, a policy switch)."""
        config, replicas = self.controller.config, self.controller.replicas
        if not self.state.leader or (
            config == self._published and replicas == self._published_replicas
        ):
            return
        # The lease may have lapsed while the step ran: never publish as a former leader.
        if not await self.bus.acquire_or_renew_lease(self.pool, self.holder, self.lease_s):
            self.state.leader = False
            return
        if config != self._published:
            await self._publish(config)
        if replicas is not None and replicas != self._published_replicas:
            await self.bus.publish_desired_replicas(self.pool, replicas)
            self._published_replicas = replicas

    # -- the stages ------------------------------------------------------------------

    async def _read(self) -> list[WorkerStats]:
        if self._cursor == "$":
            self._cursor = await self.bus.last_stats_id(self.pool)
        reports, self._cursor, malformed = await self.bus.read_worker_stats(self.pool, self._cursor)
        self.state.malformed_stats += malformed
        alive = await self.bus.workers_alive(self.pool)
        self.state.workers_alive = len(alive)
        # A heartbeat may speak for several replicas (a simulated pool, an engine adapter).
        self._replicas = sum(int(info.get("replicas", 1)) for info in alive.values())
        # Ready: started and warm (a member warming its sizes beats but is not ready), as
        # the simulator counts a replica only after its start-up and warm-up.
        self._replicas_ready = sum(
            int(info.get("replicas", 1)) for info in alive.values() if member_ready(info)
        )
        self._seen_version = max(
            [
                self._seen_version,
                *(r.config_version for r in reports),
                *(int(info.get("config_version", 0)) for info in alive.values()),
            ]
        )
        self._note_members(alive)
        self.latest.update((r.worker, r) for r in reports)
        for gone in set(self.latest) - set(alive):
            del self.latest[gone]
        return reports

    def _note_members(self, alive: dict[str, dict[str, Any]]) -> None:
        """Which engines serve the pool, and which members refuse a config (logged once
        per member and version: the member keeps its old config, so nothing else shows
        it)."""
        self.state.engines = collections.Counter(
            str(info.get("engine", "tidal-worker")) for info in alive.values()
        )
        refusing = {
            name: info["rejected"]
            for name, info in alive.items()
            if isinstance(info.get("rejected"), dict)
            and int(info["rejected"].get("version", 0)) > int(info.get("config_version", 0))
        }
        for name, refusal in refusing.items():
            if self.state.refusing.get(name) != refusal:
                log.warning(
                    "%s: %s refused config v%s (%s): %s",
                    self.pool,
                    name,
                    refusal.get("version"),
                    refusal.get("config"),
                    refusal.get("reason"),
                )
        self.state.refusing = refusing
        self._check_change_costs(alive)
        self._note_readiness(alive)

    def _note_readiness(self, alive: dict[str, dict[str, Any]]) -> None:
        """Which members are alive but not ready (logged as each changes): a worker
        that warms its starting sizes would serve at a partial cap, one whose dispatch
        loop died serves nothing, yet both still beat."""
        not_ready = {
            name: str(info.get("not_ready") or "not ready")
            for name, info in alive.items()
            if not member_ready(info)
        }
        for name in sorted(set(not_ready) | set(self.state.not_ready)):
            now, before = not_ready.get(name), self.state.not_ready.get(name)
            if now != before and (now is not None or name in alive):
                log.info("%s: %s %s", self.pool, name, f"not ready: {now}" if now else "ready")
        self.state.not_ready = not_ready
        self.state.workers_ready = len(alive) - len(not_ready)

    def _check_change_costs(self, alive: dict[str, dict[str, Any]]) -> None:
        """A member whose engine reloads for a change the plan thinks free (no `--reload`)
        is planned too late and changed too often: say so, once per engine kind."""
        planned_s = self.controller.settings.reload_s
        for info in alive.values():
            reload_s = float((info.get("change_cost") or {}).get("reload_s", 0.0))
            kind = str(info.get("engine", "tidal-worker"))
            if reload_s > planned_s and kind not in self.state.unplanned_reloads:
                self.state.unplanned_reloads[kind] = reload_s
                log.warning(
                    "%s: %s members reload for %.1f s per config change, but the pool plans "
                    "with --reload %gs: start the controller with --reload %.0fs",
                    self.pool,
                    kind,
                    reload_s,
                    planned_s,
                    max(1.0, reload_s),
                )

    def swap(self, controller: Controller) -> None:
        """Make `controller` the pool's, in one step between ticks: the jobs the one it
        replaces asked for are dropped when they finish, never installed into it."""
        self.controller = controller

    def _run_jobs(self) -> None:
        """Give finished jobs back to the controller that asked (if it is still this
        loop's), then start the jobs the controller wants, each on a thread."""
        for task in [t for t in self._jobs if t.done()]:
            owner, job = self._jobs.pop(task)
            if task.cancelled():
                continue
            outcome = task.exception() or task.result()
            if owner is not self.controller or not owner.finish(job, outcome):
                self.state.jobs_dropped += 1
                log.info("%s: %s for a replaced controller or shadow: dropped", self.pool, job.kind)
                continue
            self._note_outcome(job, outcome)
        controller = self.controller
        for job in controller.take_jobs():
            if job.kind == "replan":
                log.info(
                    "%s: the latency measured while serving drifted (%s): rebuilding the "
                    "planner's table",
                    self.pool,
                    job.drift.describe(),
                )
            task = asyncio.create_task(self._run_job(job), name=f"{job.kind}-{self.pool}")
            self._jobs[task] = (controller, job)

    def _note_outcome(self, job: ControllerJob, outcome: object) -> None:
        """Count and log what a job ended in; a failure with its traceback."""
        error = outcome.error if isinstance(outcome, FitFailed) else outcome
        if isinstance(error, Exception):
            self.state.job_failures[job.kind] += 1
            self.state.last_job_error = f"{job.kind}: {type(error).__name__}: {error}"
            log.error(
                "%s: a %s failed; keeping what the controller had, retrying after a backoff",
                self.pool,
                job.kind,
                exc_info=error,
            )
        elif job.kind == "refit":
            self.state.refits += 1
        else:
            self.state.replans += 1
            log.info("%s: %s", self.pool, self.controller.last_replan)

    async def _record(self, record: DecisionRecord) -> None:
        entry = {"time": time.time(), **record.to_dict(), "version": self.state.version}
        await self.bus.record_decision(self.pool, entry)

    async def _elect(self) -> None:
        leading = await self.bus.acquire_or_renew_lease(self.pool, self.holder, self.lease_s)
        elected = leading and not self.state.leader
        if self.sync_settings is not None and (elected or not leading):
            await self.sync_settings(elected)
        if not leading:
            stored = await self.bus.current_config(self.pool)
            if stored is not None:
                self._seen_version = max(self._seen_version, stored.version)
                self.state.version = stored.version
        if elected:
            await self._adopt()
            log.info("%s leads pool %s", self.holder, self.pool)
        self.state.leader = leading

    async def _adopt(self) -> None:
        """Start from the config in force if the bus holds one at or above every version
        seen; otherwise (none stored, or a Redis that lost its data) publish ours."""
        self._published_replicas = None  # a new leader states the count afresh
        current = await self.bus.current_config(self.pool)
        if current is not None and current.version >= self._seen_version:
            self.controller.adopt(current.config)
            self._published = current.config
            self.state.version = self.state.published_version = current.version
        else:
            await self._publish(self.controller.config)

    async def _publish(self, config: BatchConfig) -> None:
        current = await self.bus.current_config(self.pool)
        version = max(current.version if current else 0, self._seen_version) + 1
        if await self.bus.publish_config(self.pool, VersionedConfig(version, config)):
            self._published = config
            self._seen_version = version
            self.state.version = self.state.published_version = version

    def _failed(self, failure: TickFailed) -> None:
        self.state.errors[failure.stage] += 1
        cause = failure.__cause__
        if isinstance(cause, RedisError | OSError):
            if self.state.ready:
                log.warning("%s: bus unreachable (%s); keeping state, retrying", self.pool, cause)
            self.state.leader = False
        else:  # a bug must not end control silently
            log.error("%s: tick failed at %s", self.pool, failure.stage, exc_info=cause)
        self.state.ready = False
        self.state.last_error = f"{failure.stage}: {cause!r}"


def _step(
    controller: Controller, reports: list[WorkerStats], now: float, alive: int, ready: int
) -> DecisionRecord:
    """The control step on this tick's reports: `alive` replicas beat, `ready` of them
    serve (warm); the rest of those desired are starting."""
    tick_s = controller.settings.tick_s
    # Rates scale to the replicas alive; a reporter whose heartbeat has not landed yet
    # still counts for the replicas it reports.
    reporting = sum({r.worker: r.replicas for r in reports}.values())
    workers = max(alive, reporting)
    fleet = None
    if controller.replicas is not None:  # a fleet that scales: what has joined so far
        desired = controller.replicas
        fleet = FleetView(ready, max(0, desired - ready), desired)
    try:
        return controller.step(now, observe_pool(reports, now, tick_s, workers), fleet)
    except Exception as error:
        raise TickFailed("step", error) from error


async def _stage(stage: str, awaitable: Awaitable):
    try:
        return await awaitable
    except asyncio.CancelledError:
        raise
    except Exception as error:
        raise TickFailed(stage, error) from error


class _DaemonThreads(concurrent.futures.Executor):
    """Each call on a daemon thread of its own. Not the loop's default executor: a process
    exits only once an executor's threads have finished, so a SIGTERM in the middle of a
    table rebuild (seconds of CPU) would wait for work nobody will install. Used through
    `run_in_executor`, so virtual-time tests (looptime) see the work in flight."""

    def submit(self, fn, /, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as error:  # the awaiting side gets it, as from any executor
                future.set_exception(error)

        threading.Thread(target=work, name="tidal-controller-job", daemon=True).start()
        return future


_JOB_THREADS = _DaemonThreads()


async def _on_a_thread(job: ControllerJob) -> object:
    """`job.run()` on a daemon thread (`_DaemonThreads`)."""
    return await asyncio.get_running_loop().run_in_executor(_JOB_THREADS, job.run)
