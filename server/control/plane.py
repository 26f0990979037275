"""One pool under live control: its policy, overrides and events, and the loop that runs it.

`PoolControl` builds the pool's `Controller` from a policy spec (the simulator's factories,
with the optimiser's table compiled from the pool's latency model), runs it in a
`ControlLoop`, and applies what operators change through the API: a new policy (the
config in force and its version carry over), a pinned config that expires, declared
events. Each change is persisted on the bus, so a restarted or standby controller starts
from it; the forecast is primed from the per-second arrivals the bus keeps, so a restart
does not forget the day. `rollout_gate` replays the pool's recorded traffic through the
simulator with the current and a candidate policy, side by side.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
from redis.exceptions import RedisError

from adaptive.config import BatchConfig
from adaptive.controller import Controller, ControllerSettings, Override
from adaptive.decisions import config_dict
from adaptive.fleet import FleetLimits
from adaptive.forecast_feed import ForecastFeed
from adaptive.guards import Guardrails
from adaptive.latency import LatencyModel
from adaptive.learned_latency import LatencyLearner, LearningSettings
from adaptive.policy import Policy
from adaptive.specs import PolicyContext, build_policy
from forecaster.events import Event, event_to_dict, events_from_document
from server.bus.protocols import PoolBus
from server.clock import LoopClock
from server.control.loop import ControlLoop, JobRunner, TickObserver
from server.tasks import cancel_and_wait
from simulations.calibration import performance_table
from simulations.engine import PoolSettings, Routing
from simulations.report import policy_summary
from simulations.run import SimulationSettings, simulate
from simulations.traces import CountTrace
from tidal_base.errors import InvalidInput

log = logging.getLogger("tidal.controller")

MIN_GATE_S = 60
"""The rollout gate needs at least this much recorded traffic to judge a policy."""


@dataclass(frozen=True)
class PoolPlan:
    """How this controller runs one pool: its command line, before operator changes."""

    pool: str
    policy: str
    latency: LatencyModel
    slo_s: float = 0.1
    tick_s: float = 1.0
    workers: int = 1
    warmup_s: float = 0.0
    reload_s: float = 0.0
    routing: Routing = Routing.ROUND_ROBIN
    events: tuple[Event, ...] = ()
    guardrails: Guardrails = field(default_factory=Guardrails)
    shadow: str | None = None
    lease_s: float = 3.0
    fleet: FleetLimits | None = None  # None: `workers` throughout
    learning: LearningSettings = field(default_factory=LearningSettings)

    @property
    def pool_settings(self) -> PoolSettings:
        return PoolSettings(
            self.workers, self.slo_s, self.routing, warmup_s=self.warmup_s, reload_s=self.reload_s
        )


@dataclass(frozen=True, slots=True)
class PinnedConfig:
    """An operator override as the API and the bus see it (Unix time)."""

    config: BatchConfig
    until: float
    reason: str = ""
    replicas: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **config_dict(self.config),
            "until": self.until,
            "reason": self.reason,
            "replicas": self.replicas,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PinnedConfig:
        config = BatchConfig(int(d["max_batch"]), d["timeout_ms"] / 1e3, d["warm_max_batch"])
        replicas = d.get("replicas")
        return cls(
            config,
            float(d["until"]),
            str(d.get("reason", "")),
            None if replicas is None else int(replicas),
        )


class PoolControl:
    def __init__(
        self,
        plan: PoolPlan,
        bus: PoolBus,
        holder: str,
        observer: TickObserver | None = None,
        run_job: JobRunner | None = None,
    ) -> None:
        self.plan = plan
        self.pool = plan.pool
        self.bus = bus
        self.holder = holder
        self.observer = observer
        self.run_job = run_job  # None: the loop runs its controller's jobs on threads
        self.clock = LoopClock()
        self.origin_s = self.clock.origin_s
        self.policy_spec = plan.policy
        self.shadow_spec = plan.shadow  # the operator may set or lift it (`set_shadow`)
        self.events = plan.events
        self.pinned: PinnedConfig | None = None
        self._seen: dict[str, Any] | None = None  # the bus's settings last applied
        self._built: dict[str, Policy] = {}  # policies built before serving (`prepare`)
        self.loop: ControlLoop | None = None
        self.start_error: str | None = None  # why the pool never started ticking
        self.settings_error: str | None = None  # why stored settings were not applied
        self._task: asyncio.Task | None = None
        self._lock = asyncio.Lock()

    # -- lifecycle -------------------------------------------------------------------

    def prepare(self) -> None:
        """Build the plan's policies now, before serving: a bad spec fails the command in
        its first seconds (InvalidInput naming the spec), not in a background task."""
        for spec in filter(None, (self.plan.policy, self.plan.shadow)):
            self._built[spec] = build_policy(spec, self.policy_context())

    async def start(self) -> None:
        """Restore the pool's persisted settings, build the controller, start ticking.
        Failures are recorded in `start_error` (the API's /readyz shows it) and raised."""
        try:
            await self._start()
        except BaseException as error:
            self.start_error = f"{type(error).__name__}: {error}"
            log.error("%s: the control loop did not start", self.pool, exc_info=error)
            raise

    async def _start(self) -> None:
        self.clock.now()  # clock zero, and origin_s with it, before anything is timed
        self.origin_s = self.clock.origin_s
        with contextlib.suppress(RedisError, OSError):  # unreachable: the plan's settings
            stored = await self.bus.load_settings(self.pool)
            if stored:
                self._seen = stored
                self.policy_spec = await self._restore_or_keep(stored)
        controller = await self._controller(self.policy_spec)
        self.loop = ControlLoop(
            controller,
            self.bus,
            self.holder,
            self.plan.lease_s,
            self.observer,
            sync_settings=self._sync_settings,
            clock=self.clock,
            run_job=self.run_job,
        )
        self._task = asyncio.create_task(self.loop.run(), name=f"control-{self.pool}")

    async def _restore_or_keep(self, stored: dict[str, Any]) -> str:
        """Take the stored settings; if they are bad (a stored policy that no longer
        builds, events a newer release wrote), say so loudly and keep the plan's."""
        try:
            spec = await self._restore(stored)
            await self.build_policy(spec)
            shadow = self._stored_shadow(stored)
            if shadow is not None:
                await self.build_policy(shadow)
            self.shadow_spec = shadow
            return spec
        except InvalidInput as error:
            self.settings_error = f"stored settings of pool {self.pool!r} ignored: {error}"
            log.error("%s", self.settings_error)
            self.events, self.pinned = self.plan.events, None
            return self.plan.policy

    async def stop(self) -> None:
        if self._task is None:
            return
        await cancel_and_wait(self._task)

    async def _sync_settings(self, elected: bool) -> None:
        """Follow the operators' settings on the bus (the leader writes them); a new
        leader facing a bus that lost them (a Redis restarted empty) writes ours back.
        Under the lock the operator's writes take: a read that raced an unpin would
        otherwise restore the pin it had just lifted."""
        async with self._lock:
            await self._sync_settings_locked(elected)

    async def _sync_settings_locked(self, elected: bool) -> None:
        stored = await self.bus.load_settings(self.pool)
        if elected and not stored:
            await self._save_all()
            self._seen = self._all_settings()
            return
        if stored == self._seen:
            return
        self._seen = stored
        try:
            policy = await self._restore(stored)
        except InvalidInput as error:  # never stop controlling over a bad stored setting
            self.settings_error = f"stored settings of pool {self.pool!r} ignored: {error}"
            log.error("%s", self.settings_error)
            return
        self.settings_error = None
        shadow_before = self.shadow_spec
        self.shadow_spec = self._stored_shadow(stored)
        self.controller.set_events(self.events)
        self.controller.pin(self._override())
        if policy != self.policy_spec:
            await self._switch_policy(policy, persist=False)
        elif self.shadow_spec != shadow_before:
            await self._apply_shadow()

    def _all_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {}
        if self.policy_spec != self.plan.policy:
            settings["policy"] = self.policy_spec
        if self.events:
            settings["events"] = self._events_document()
        if self.active_override() is not None:
            settings["override"] = self.pinned.to_dict()
        if self.shadow_spec != self.plan.shadow:
            settings["shadow"] = self.shadow_spec or ""  # "": lifted
        return settings

    def _stored_shadow(self, stored: dict[str, Any]) -> str | None:
        """The shadow the stored settings name: the plan's if they say nothing, none if
        an operator lifted it (stored as "")."""
        shadow = stored.get("shadow")
        return self.plan.shadow if shadow is None else (str(shadow) or None)

    async def _save_all(self) -> None:
        for name, value in self._all_settings().items():
            await self.bus.save_setting(self.pool, name, value)

    async def _restore(self, stored: dict[str, Any]) -> str:
        """Take events and override from `stored`; returns the policy spec it names."""
        where = f"stored events of {self.pool}"
        self.events = events_from_document(stored.get("events", []), where)
        override = stored.get("override")
        self.pinned = PinnedConfig.from_dict(override) if override else None
        return stored.get("policy", self.plan.policy)

    # -- building --------------------------------------------------------------------

    def _compile_table(self, latency: LatencyModel, workers: int, slo_s: float):
        """The optimiser's table for a (learned) latency model, as the plan compiles it:
        a rebuild while the pool serves, so on one core (the old table plans meanwhile); on
        every core it took both of a 2-core machine for 3-4 s, beside the workers."""
        plan = self.plan
        padded = plan.warmup_s > 0
        return performance_table(
            latency, workers, slo_s, padded, plan.routing, cached=False, threads=1
        )

    def policy_context(self) -> PolicyContext:
        plan = self.plan

        def table(slo_s: float):
            return performance_table(
                plan.latency, plan.workers, slo_s, plan.warmup_s > 0, plan.routing
            )

        def replica_table(slo_s: float):
            return performance_table(plan.latency, 1, slo_s, plan.warmup_s > 0, plan.routing)

        fleet = plan.fleet
        return PolicyContext(
            slo_s=plan.slo_s,
            workers=plan.workers,
            table=table,
            replica_table=replica_table if fleet is not None else None,
            replica_startup_s=fleet.startup_s if fleet is not None else 0.0,
        )

    async def build_policy(self, spec: str) -> Policy:
        """The policy a spec names; InvalidInput names the spec and option. Compiling the
        optimiser's table takes seconds of CPU, so it runs off the event loop."""
        built = self._built.pop(spec, None)
        if built is not None:
            return built
        return await asyncio.to_thread(build_policy, spec, self.policy_context())

    async def _controller(self, spec: str, learner: LatencyLearner | None = None) -> Controller:
        """A controller of its own for `spec`: policy and shadow built fresh from their
        specs, the pin and events in force, the forecast primed from recorded traffic."""
        plan = self.plan
        policy = await self.build_policy(spec)
        shadow = await self.build_policy(self.shadow_spec) if self.shadow_spec else None
        settings = ControllerSettings(
            pool=plan.pool,
            slo_s=plan.slo_s,
            tick_s=plan.tick_s,
            workers=plan.workers,
            warmup_s=plan.warmup_s,
            reload_s=plan.reload_s,
            origin_s=self.origin_s,
            events=self.events,
            guardrails=plan.guardrails,
            defer_fits=True,
            fleet=plan.fleet,
            latency=plan.latency,
            learning=plan.learning,
        )
        controller = Controller(
            policy, settings, shadow=shadow, compile_table=self._compile_table, learner=learner
        )
        controller.pin(self._override())
        with contextlib.suppress(RedisError, OSError):
            await self._prime(controller)
        return controller

    async def _prime(self, controller: Controller) -> None:
        """Feed the forecasts (the policy's and the shadow's) the pool's recorded arrivals:
        a restart, a switch or a new shadow keeps the day's history."""
        shadow = controller.shadow
        await self._prime_feeds(
            [f for f in (controller.feed, shadow.feed if shadow else None) if f is not None]
        )

    async def _prime_feeds(self, feeds: list[ForecastFeed]) -> None:
        """One read of the bus for every feed: each keeps only its own history's span."""
        if not feeds:
            return
        _, counts = await self._recorded(max(f.history_s for f in feeds))
        if not counts.size:
            return
        for feed in feeds:
            feed.prime(counts, self.clock.now())
        log.info("%s: forecast primed with %d s of recorded traffic", self.pool, counts.size)

    async def _recorded(self, span_s: float) -> tuple[int, np.ndarray]:
        """Arrivals per second over the last `span_s`, from the first recorded second
        through the last (a second inside with no report counts 0), and the Unix second
        they start at. Seconds after the last report are unknown, not idle: nobody was
        recording them (a controller restarting while workers were away), so they are
        left out rather than counted as zero traffic."""
        now = int(time.time())
        recorded = await self.bus.arrivals_per_second(self.pool, now - int(span_s), now + 1)
        if not recorded:
            return now, np.zeros(0)
        first, last = min(recorded), max(recorded)
        counts = np.zeros(last - first + 1)
        for second, n in recorded.items():
            counts[second - first] = n
        return first, counts

    def _override(self) -> Override | None:
        if self.pinned is None:
            return None
        until_s = self.pinned.until - self.origin_s
        return Override(self.pinned.config, until_s, self.pinned.reason, self.pinned.replicas)

    # -- operator changes ------------------------------------------------------------

    @property
    def controller(self) -> Controller:
        return self.loop.controller

    async def set_policy(self, spec: str, persist: bool = True) -> None:
        """Switch policy: a new controller, its policy built fresh from `spec`; the config
        in force and its version carry over, and a copy of what serving taught."""
        async with self._lock:
            await self._switch_policy(spec, persist)

    async def _switch_policy(self, spec: str, persist: bool) -> None:
        old = self.controller
        learned = None if old.latency is None else old.latency.copy()
        fresh = await self._controller(spec, learned)
        fresh.adopt(old.config)
        self.loop.swap(fresh)
        self.policy_spec = spec  # as the operator wrote it
        if persist:
            await self.bus.save_setting(self.pool, "policy", self.policy_spec)

    async def set_shadow(self, spec: str | None) -> None:
        """Run `spec` beside the policy from the next tick, recorded and never applied
        (None lifts the shadow); built fresh from its spec, persisted for a restart."""
        async with self._lock:
            policy = None if spec is None else await self.build_policy(spec)
            self.shadow_spec = spec
            await self._install_shadow(policy)
            stored = None if spec == self.plan.shadow else (spec or "")
            await self.bus.save_setting(self.pool, "shadow", stored)

    async def _apply_shadow(self) -> None:
        """The controller's shadow as `shadow_spec` says (the stored settings changed)."""
        spec = self.shadow_spec
        await self._install_shadow(None if spec is None else await self.build_policy(spec))

    async def _install_shadow(self, policy: Policy | None) -> None:
        """`policy` (built fresh) as the controller's shadow, its forecast primed."""
        controller = self.controller
        controller.set_shadow(policy)
        if controller.shadow is not None and controller.shadow.feed is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._prime_feeds([controller.shadow.feed])

    async def pin(
        self, config: BatchConfig, for_s: float, reason: str, replicas: int | None = None
    ) -> PinnedConfig:
        if replicas is not None and self.plan.fleet is None:
            raise InvalidInput(
                f"pool {self.pool!r} has a fixed fleet: start its controller with "
                "--max-replicas to pin a replica count"
            )
        async with self._lock:
            self.pinned = PinnedConfig(config, time.time() + for_s, reason, replicas)
            self.controller.pin(self._override())
            await self.loop.publish_if_changed()  # a pin applies at once, not next tick
            await self.bus.save_setting(self.pool, "override", self.pinned.to_dict())
            return self.pinned

    async def unpin(self) -> bool:
        async with self._lock:
            held, self.pinned = self.pinned, None
            self.controller.pin(None)
            await self.bus.save_setting(self.pool, "override", None)
            return held is not None

    async def set_events(self, events: tuple[Event, ...]) -> None:
        async with self._lock:
            self.events = events
            self.controller.set_events(events)
            await self.bus.save_setting(self.pool, "events", self._events_document())

    def _events_document(self) -> list[dict[str, Any]]:
        return [event_to_dict(e) for e in self.events]

    def active_override(self) -> PinnedConfig | None:
        if self.pinned is not None and self.pinned.until <= time.time():
            self.pinned = None  # expired: the controller has let go of it too
        return self.pinned

    def latency_model(self) -> LatencyModel:
        """The latency model learned from serving (the plan's until workers report)."""
        learner = self.controller.latency
        return self.plan.latency if learner is None else learner.model()

    # -- the rollout gate ------------------------------------------------------------

    async def rollout_gate(self, candidate: str, hours: float, seed: int = 0) -> dict[str, Any]:
        """Current vs candidate policy on the pool's last `hours` of recorded traffic."""
        candidate_policy = await self.build_policy(candidate)
        first, counts = await self._recorded(hours * 3600)
        if counts.size < MIN_GATE_S:
            raise InsufficientHistory(
                f"pool {self.pool!r} has {counts.size} s of recorded traffic; "
                f"the rollout gate needs at least {MIN_GATE_S} s"
            )
        trace = CountTrace(
            f"{self.pool}: recorded traffic", 1.0, counts, datetime.fromtimestamp(first, UTC)
        )
        current_policy = await self.build_policy(self.policy_spec)
        settings = SimulationSettings(
            pool=self.plan.pool_settings,
            tick_s=self.plan.tick_s,
            seed=seed,
            events=self.events,
            origin_s=float(first),
            guardrails=self.plan.guardrails,
        )
        # In this process (processes=1): forking a server with live threads (the event
        # loop, Redis connections) could copy a lock some other thread holds.
        latency = self.latency_model()
        report = await asyncio.to_thread(
            functools.partial(simulate, processes=1),
            trace,
            [current_policy, candidate_policy],
            settings,
            latency,
        )
        current, proposed = (policy_summary(r) for r in report.results)
        # Judged on what clients see when the plan's profile measured the time outside
        # the batcher; on the batcher's own account otherwise.
        judged_on = (
            "client_slo_attainment" if "client_slo_attainment" in current else ("slo_attainment")
        )
        return {
            "traffic": {"from": first, "seconds": int(counts.size), "requests": report.requests},
            "current": current,
            "candidate": proposed,
            "no_worse_on_slo": proposed[judged_on] >= current[judged_on],
            "judged_on": judged_on,
            "latency_model": latency.describe(),
        }


class InsufficientHistory(InvalidInput):
    """Not enough recorded traffic for the rollout gate to judge."""
