"""The control step: observe, forecast, decide, guard, record.

One `Controller` per pool. Each `step(now, stats)` feeds the tick's arrivals to the
forecast (for policies that plan ahead), asks the policy, passes the answer through the
guardrails and returns a `DecisionRecord`; `config` is then the config the pool should
run. It reads no clock and does no I/O: the shells (the simulator's per-policy driver,
the live control loop) hand it the time and the `PoolStats` built by
`adaptive.bus.observe_pool`, and publish, number and log what it decided.

Planning on the hardware as it serves: given the latency model the pool was planned
with (`ControllerSettings.latency`) and a way to compile tables (`compile_table`), the
controller learns each padded batch size's execution time from the workers' reports
(`adaptive.learned_latency`); when the learned model drifts past a threshold from the
one the planner's table came from, it asks for the table to be rebuilt (`ReplanJob`,
run on a thread by the live shell) and the next decision record says so.

Tail safety: when actual load runs outside the forecast band for `fallback_after_s`
(or there is no forecast yet), the fallback policy (reactive by default) decides until
the forecast has been right again for `recover_after_s`.

Ownership: a controller owns its policy, its shadow, its forecast feed, its latency
learner, its guards and the background jobs it hands out (`take_jobs`: refits, table
rebuilds); a job's outcome goes back only to the controller that asked (`finish`). A
shadow policy runs in a controller of its own, with its own forecast feed, fallback and
guards, stepped on the same observations; its choices are recorded and never applied.
A policy object decides for one controller only (`claim`): every boundary (a switch, a
promotion, the simulator and live) builds a fresh one from its spec, so no state
recorded on one clock is read on another.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, is_dataclass, replace
from typing import ClassVar

import numpy as np

from adaptive.bus import PoolStats
from adaptive.change_cost import ChangeCost
from adaptive.config import BatchConfig
from adaptive.decisions import DecisionRecord, ForecastUsed, Mode, ShadowDecision
from adaptive.fleet import FleetLimits, FleetView
from adaptive.forecast_feed import FitFailed, FitJob, FitOutcome, ForecastFeed
from adaptive.guards import Guard, Guardrails
from adaptive.latency import LatencyModel
from adaptive.learned_latency import Drift, LatencyLearner, LearningSettings
from adaptive.optimizer import ConfigOptimizer, PerformanceTable
from adaptive.policy import Decision, ForecastingPolicy, PlanningPolicy, Policy, Snapshot
from adaptive.reactive import ReactivePolicy
from forecaster.events import Event
from forecaster.forecast import Forecast
from tidal_base.errors import InvalidInput, PolicyInUse


@dataclass(frozen=True, slots=True)
class Override:
    """A config pinned by an operator until `until_s` (controller clock)."""

    config: BatchConfig
    until_s: float
    reason: str = ""
    replicas: int | None = None  # a replica count pinned too (a fleet that scales)


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """One pool's control loop. `origin_s` is the Unix time of clock zero (for events)."""

    pool: str = "default"
    slo_s: float = 0.1
    tick_s: float = 1.0
    workers: int = 1
    warmup_s: float = 0.0
    reload_s: float = 0.0  # an engine that reloads the model for any change (Triton)
    fallback_after_s: float = 60.0
    recover_after_s: float = 300.0
    origin_s: float = 0.0
    events: tuple[Event, ...] = ()
    guardrails: Guardrails = field(default_factory=Guardrails)
    defer_fits: bool = False  # the live loop refits forecasts on a thread (ForecastFeed)
    fleet: FleetLimits | None = None  # None: a fixed fleet of `workers`
    latency: LatencyModel | None = None  # the model planned with; None: learn nothing
    learning: LearningSettings = field(default_factory=LearningSettings)

    def __post_init__(self) -> None:
        if self.tick_s <= 0:
            raise InvalidInput(f"tick must be > 0, got {self.tick_s}")
        if self.fallback_after_s < 0 or self.recover_after_s < 0:
            raise InvalidInput("fallback_after and recover_after must be >= 0")
        ChangeCost(self.warmup_s, self.reload_s)  # validates both

    @property
    def change_cost(self) -> ChangeCost:
        """What a config change costs the pool's engine (warm-up per bucket, reload)."""
        return ChangeCost(self.warmup_s, self.reload_s)


TableCompiler = Callable[[LatencyModel, int, float], PerformanceTable]
"""Compiles the optimiser's table for (latency model, workers, SLO): the shell's part."""


@dataclass(frozen=True)
class ReplanJob:
    """A planner's table to rebuild for a learned latency model (seconds of CPU: the live
    shell runs `run` on a thread and hands the result to `Controller.finish`)."""

    kind: ClassVar[str] = "replan"
    model: LatencyModel
    drift: Drift
    optimizers: tuple[ConfigOptimizer, ...]  # those in use, one per planning policy
    compile_table: TableCompiler
    planners: tuple[PlanningPolicy, ...] = field(default=(), compare=False, repr=False)

    def run(self) -> tuple[ConfigOptimizer, ...]:
        """The same optimisers (SLO, margin, pool size) on tables of the new model."""
        compile_table = self.compile_table
        return tuple(
            ConfigOptimizer(compile_table(self.model, o.table.workers, o.slo_s), o.slo_s, o.margin)
            for o in self.optimizers
        )


@dataclass(frozen=True)
class RefitJob:
    """A forecast refit for one feed (the active policy's or the shadow's): `run` returns
    a `FitOutcome` and never raises (a failed fit is an outcome)."""

    kind: ClassVar[str] = "refit"
    fit: FitJob
    feed: ForecastFeed = field(compare=False, repr=False)  # the feed that asked

    def run(self) -> FitOutcome:
        """The fit, anywhere (a thread): its outcome, never an exception."""
        return self.fit.run()


ControllerJob = RefitJob | ReplanJob
"""Work a controller hands its shell to run off the control step (`Controller.take_jobs`)."""


_serials = itertools.count(1)


def claim(policy: Policy, serial: int) -> None:
    """Take `policy` for the controller numbered `serial`; `PolicyInUse` if another
    controller has it. A frozen dataclass holds no state and may be shared."""
    if is_dataclass(policy) and type(policy).__dataclass_params__.frozen:
        return
    owner = getattr(policy, "_tidal_controller", None)
    if owner is not None and owner != serial:
        raise PolicyInUse(
            f"policy {policy.spec!r} already decides for another controller (its state is "
            "on that controller's clock): build a fresh one from its spec"
        )
    policy._tidal_controller = serial  # type: ignore[attr-defined]


class Controller:
    """Decides a pool's batch config every tick; the same code in simulation and live."""

    def __init__(
        self,
        policy: Policy,
        settings: ControllerSettings,
        *,
        fallback: Policy | None = None,
        shadow: Policy | None = None,
        compile_table: TableCompiler | None = None,
        learner: LatencyLearner | None = None,
    ) -> None:
        """`shadow` decides in a controller of its own, never applied. `learner`: what
        serving taught a controller this one replaces (a copy, `LatencyLearner.copy`);
        None starts from `settings.latency`."""
        self.serial = next(_serials)
        for owned in filter(None, (policy, fallback)):
            claim(owned, self.serial)
        self.policy = policy
        self.settings = settings
        self.shadow: Controller | None = None
        self.set_shadow(shadow)
        self.guard = Guard(settings.guardrails)
        self._spec = policy.spec
        self.feed = self._feed(policy, settings)
        self.fallback = fallback or (ReactivePolicy() if self.feed is not None else None)
        self.config = settings.guardrails.clamp(policy.initial_config())
        self.mode = Mode.ACTIVE if self.feed is None else Mode.FALLBACK
        self.mode_reason = "" if self.feed is None else "no forecast yet"
        self.fallback_s = 0.0
        self.config_changes = 0
        self.last: DecisionRecord | None = None
        self._inside_since: float | None = None
        self._forecast_in: Forecast | None = None
        self._forecast_here: Forecast | None = None
        self.override: Override | None = None
        self._released = False
        # The config a new pin replaced, until the next record says so (a pin applies at
        # once, so that step alone would see no change and keep no record of it).
        self._pinned_over: BatchConfig | None = None
        self._changed_at = -float("inf")  # when the config last changed (for spacing)
        fleet = settings.fleet
        # The replica count the pool should have; None for a fixed fleet.
        self.replicas: int | None = None if fleet is None else fleet.clamp(settings.workers)
        self.slo_infeasible_since: float | None = None
        self.replica_changes = 0
        # The learned latency model, the model the planner's table was compiled from,
        # and the rebuilds: asked for (`_replan`), taken by the shell, installed.
        prior = settings.latency
        if learner is None and prior is not None:
            learner = LatencyLearner(prior, settings.learning)
        self.latency = learner if prior is not None else None
        self.planned_latency = settings.latency
        self.replans = 0
        self.last_replan: str | None = None  # why the table was last rebuilt
        self._compile_table = compile_table
        self._replan: ReplanJob | None = None
        self._replan_taken = False
        self._replanned_at = -float("inf")
        self._replan_note: str | None = None  # for the next decision record

    @property
    def spec(self) -> str:
        """The spec of the policy that decides."""
        return self._spec

    def set_shadow(self, shadow: Policy | None) -> None:
        """Run `shadow` beside from the next step, in a controller of its own (None: no
        shadow). A refit the one it replaces asked for is dropped when it finishes."""
        self.shadow = None if shadow is None else self._shadow_controller(shadow)

    def _shadow_controller(self, shadow: Policy) -> Controller:
        # The shadow plans on the tables this controller rebuilds and learns nothing itself.
        return Controller(shadow, replace(self.settings, latency=None))

    def adopt(self, config: BatchConfig) -> None:
        """Take over a pool whose workers run `config` (a new leader, a policy switch)."""
        self.config = config
        self._pinned_over = None

    def pin(self, override: Override | None) -> None:
        """An operator's pinned config (None lifts it): applied at once and as it is,
        past the guardrails, until it expires; the policy keeps deciding, on the record."""
        # A lifted pin stays lifted until the next step has let the policy's config
        # back past the dwell: lifting it again (the API's DELETE twice, the settings
        # sync echoing the leader's own write) must not cancel that.
        if override is None:
            self._released = self._released or self.override is not None
        else:
            self._released = False
            if override != self.override and self._pinned_over is None:
                self._pinned_over = self.config
        self.override = override
        if override is not None and override.config != self.config:
            self.config_changes += 1
            self.config = override.config
        self._pin_replicas()

    def _replicas_wanted(self, decision: Decision) -> int | None:
        """The replica count after this tick: an operator's pin, else the policy's within
        the limits; None to keep it (a fixed fleet, or a policy with no opinion)."""
        if self.replicas is None:
            return None
        if self.override is not None and self.override.replicas is not None:
            return self.override.replicas
        if decision.replicas is None:
            return None
        return self.settings.fleet.clamp(decision.replicas)

    def _pin_replicas(self) -> None:
        """An operator's replica count holds while the pin does, past the limits."""
        override = self.override
        if override is None or override.replicas is None or self.replicas is None:
            return
        if override.replicas != self.replicas:
            self.replica_changes += 1
            self.replicas = override.replicas

    def set_events(self, events: tuple[Event, ...]) -> None:
        """Declared events changed: forecast with them from the next step (the shadow too)."""
        self.settings = replace(self.settings, events=events)
        if self.feed is not None:
            self.feed.set_events(events)
        if self.shadow is not None:
            self.shadow.set_events(events)

    @staticmethod
    def _feed(policy: Policy, settings: ControllerSettings) -> ForecastFeed | None:
        if not isinstance(policy, ForecastingPolicy):
            return None
        return ForecastFeed(
            policy.forecaster,
            step_s=policy.forecast_step_s,
            horizon_s=policy.horizon_s(settings.warmup_s, settings.tick_s, settings.reload_s),
            origin_s=settings.origin_s,
            events=settings.events if policy.uses_events else None,
            history_s=policy.history_s,
            defer_fits=settings.defer_fits,
        )

    def step(self, now: float, stats: PoolStats, fleet: FleetView | None = None) -> DecisionRecord:
        """One control step at `now` (seconds on the shell's clock) on one tick's stats;
        `fleet` is the pool's replicas as the shell sees them (a fleet that can change)."""
        if self.last is not None and now < self.last.at_s:
            raise InvalidInput(
                f"controller of pool {self.settings.pool!r} stepped at {now:.3f} s after "
                f"{self.last.at_s:.3f} s: one controller runs on one clock"
            )
        shadow = None if self.shadow is None else self.shadow.step(now, stats, fleet)
        forecast = self._observe(now, stats)
        self._learn(now, stats)
        fleet = self._fleet_view(fleet)
        snapshot = Snapshot(
            now=now,
            observation=stats.observation,
            config=self.config,
            slo_s=self.settings.slo_s,
            workers=self.settings.workers if fleet is None else max(1, fleet.ready),
            fleet=fleet,
            warmed_buckets=stats.warmed_buckets,
            warmup_s=self.settings.warmup_s,
            tick_s=self.settings.tick_s,
            forecast=forecast,
            reload_s=self.settings.reload_s,
        )
        return self._decide(snapshot, shadow)

    # -- the learned latency model -------------------------------------------------------

    def _planners(self) -> tuple[PlanningPolicy, ...]:
        shadow = None if self.shadow is None else self.shadow.policy
        return tuple(p for p in (self.policy, shadow) if isinstance(p, PlanningPolicy))

    def _learn(self, now: float, stats: PoolStats) -> None:
        """Take the tick's execution times; ask for a rebuilt table on drift."""
        learner = self.latency
        if learner is None:
            return
        if stats.execution:
            learner.observe(now, stats.execution)
        learning = self.settings.learning
        if (
            self._compile_table is None
            or self._replan is not None
            or now - self._replanned_at < learning.min_interval_s
        ):
            return
        planners = self._planners()
        if not planners:
            return
        drift = learner.drift(self.planned_latency)
        if drift.batch_size is None or abs(drift.relative) < learning.drift_threshold:
            return
        optimizers = tuple(p.optimizer for p in planners)
        self._replan = ReplanJob(learner.model(), drift, optimizers, self._compile_table, planners)
        self._replanned_at = now
        if not self.settings.defer_fits:  # a synchronous shell rebuilds in the step
            job = self._take_replan_job()
            self.install_replan(job, job.run())

    # -- background jobs -------------------------------------------------------------

    def take_jobs(self) -> tuple[ControllerJob, ...]:
        """The work this controller wants run off the step (refits of its feed and its
        shadow's, a table rebuild), each handed out once; the shell runs `job.run()`
        anywhere and gives the outcome back to this controller's `finish`, or drops it
        if this controller has been replaced meanwhile."""
        jobs: list[ControllerJob] = []
        for feed in filter(None, (self.feed, self._shadow_feed())):
            fit = feed.take_fit_job()
            if fit is not None:
                jobs.append(RefitJob(fit, feed))
        replan = self._take_replan_job()
        if replan is not None:
            jobs.append(replan)
        return tuple(jobs)

    def finish(self, job: ControllerJob, outcome: object) -> bool:
        """Take back a job's outcome: what `job.run()` returned, or the exception it
        raised. A failed refit is counted by its feed and retried after a backoff; a
        failed rebuild is asked for again after the learning interval. False (nothing
        installed) for a job of a feed this controller no longer has (a shadow replaced)."""
        if isinstance(job, RefitJob):
            if job.feed is not self.feed and job.feed is not self._shadow_feed():
                return False
            if isinstance(outcome, Exception):
                outcome = FitFailed(outcome)
            job.feed.install(job.fit, outcome)
        elif job is not self._replan:
            return False
        elif isinstance(outcome, Exception):
            self.replan_failed(job)
        else:
            self.install_replan(job, outcome)
        return True

    def _shadow_feed(self) -> ForecastFeed | None:
        return None if self.shadow is None else self.shadow.feed

    def _take_replan_job(self) -> ReplanJob | None:
        """The rebuild asked for and not yet taken (the shell runs it, then installs it)."""
        if self._replan is None or self._replan_taken:
            return None
        self._replan_taken = True
        return self._replan

    def install_replan(self, job: ReplanJob, optimizers: tuple[ConfigOptimizer, ...]) -> None:
        """Plan on the rebuilt tables from the next step; the next record says why."""
        current = self._planners()
        for policy, optimizer in zip(job.planners, optimizers, strict=True):
            if any(policy is p for p in current):  # not a shadow replaced meanwhile
                policy.replan(optimizer)
        self.planned_latency = job.model
        self.replans += 1
        self.last_replan = (
            f"latency model rebuilt from serving ({job.drift.describe()}): "
            f"planning on {job.model.describe()}"
        )
        self._replan_note = self.last_replan
        self._replan, self._replan_taken = None, False

    def replan_failed(self, job: ReplanJob) -> None:
        """The shell could not rebuild (it logs why): ask again after the interval."""
        if self._replan is job:
            self._replan, self._replan_taken = None, False

    def _fleet_view(self, seen: FleetView | None) -> FleetView | None:
        """What the policy sees of the fleet: the shell's view with the count asked for,
        or, if the shell has none, every replica asked for taken as ready."""
        limits = self.settings.fleet
        if limits is None or self.replicas is None:
            return None
        if seen is None:
            return FleetView(self.replicas, 0, self.replicas, limits.startup_s)
        return FleetView(seen.ready, seen.starting, self.replicas, limits.startup_s)

    def _observe(self, now: float, stats: PoolStats) -> Forecast | None:
        if self.feed is None:
            return None
        self.feed.observe(now, stats.observation.arrivals)
        self._update_mode(now)
        return self._forecast_in_clock()

    def _update_mode(self, now: float) -> None:
        feed = self.feed
        if feed.forecast is None:
            self.mode, self.mode_reason = Mode.FALLBACK, "no forecast yet"
            return
        outside_s = feed.outside_band_s(now)
        if self.mode is Mode.ACTIVE:
            if outside_s >= self.settings.fallback_after_s > 0:
                self.mode = Mode.FALLBACK
                self.mode_reason = f"actual load outside the forecast band for {outside_s:.0f} s"
                self._inside_since = None
            return
        if outside_s > 0 and self.mode_reason != "no forecast yet":
            self._inside_since = None
            return
        if self._inside_since is None:
            self._inside_since = now
        recovering = self.mode_reason == "no forecast yet"
        if recovering or now - self._inside_since >= self.settings.recover_after_s:
            self.mode, self.mode_reason = Mode.ACTIVE, ""

    def _forecast_in_clock(self) -> Forecast | None:
        """The feed's forecast with its times moved into the controller's clock."""
        forecast = self.feed.forecast
        if forecast is not self._forecast_in:
            self._forecast_in = forecast
            self._forecast_here = (
                None
                if forecast is None
                else replace(forecast, times_s=forecast.times_s - self.settings.origin_s)
            )
        return self._forecast_here

    def _decide(self, snapshot: Snapshot, shadowed: DecisionRecord | None) -> DecisionRecord:
        now = snapshot.now
        decision = self.policy.decide(snapshot) if snapshot.forecast or not self.feed else None
        if self.fallback is not None:
            # Decides every tick, so its online model is current for a handover.
            backup = self.fallback.decide(snapshot)
            if self.mode is Mode.FALLBACK:
                decision = _more_cautious(backup, decision, self.mode_reason, self.fallback.spec)
        shadow = None
        if shadowed is not None:  # what it would run, and why, guards included
            why = (
                shadowed.reason
                if shadowed.guard is None
                else f"{shadowed.reason}; {shadowed.guard}"
            )
            shadow = ShadowDecision(shadowed.policy, shadowed.chosen, why)
        if self.override is not None and now >= self.override.until_s:
            self.override, self._released = None, True
        # Right after a pin ends the policy's config resumes at once: the dwell guards
        # against the policy's own churn, not against returning from an operator's pin.
        released = self._released
        protective = decision.protective or released
        self._released = False
        chosen, guard_note = self.guard.apply(now, self.config, decision.config, protective)
        chosen, guard_note = self._space(now, chosen, guard_note)
        if self.override is not None:
            chosen = self.override.config
            guard_note = f"pinned by the operator for {self.override.until_s - now:.0f} s more"
            if self.override.reason:
                guard_note += f": {self.override.reason}"
        previous = self.config
        if chosen != previous:
            self.config_changes += 1
            self.config = chosen
            self._changed_at = now
        replicas_before = self.replicas
        wanted = self._replicas_wanted(decision)
        if wanted is not None and wanted != replicas_before:
            self.replica_changes += 1
            self.replicas = wanted
        if self.mode is Mode.FALLBACK:
            self.fallback_s += self.settings.tick_s
        # Since when the policy predicts no config meets the SLO (None: it does, or it
        # does not predict): the shell says so once, the API and a gauge show it.
        if decision.meets_slo is False:
            if self.slo_infeasible_since is None:
                self.slo_infeasible_since = now
        else:
            self.slo_infeasible_since = None
        reason = decision.reason
        record = DecisionRecord(
            at_s=now,
            pool=self.settings.pool,
            policy=self._spec,
            mode=self.mode,
            observation=snapshot.observation,
            warmed_buckets=snapshot.warmed_buckets,
            forecast=_forecast_used(snapshot),
            previous=previous if self._pinned_over is None else self._pinned_over,
            proposed=decision.config,
            chosen=chosen,
            reason=reason,
            guard=guard_note,
            predicted_p99_s=decision.predicted_p99_s,
            planned_rate_rps=decision.planned_rate_rps,
            alternatives=decision.alternatives,
            shadow=shadow,
            noteworthy=self._noteworthy(
                chosen != previous
                or self.replicas != replicas_before
                or released
                or self._pinned_over is not None,
                shadow,
            ),
            replicas_before=replicas_before,
            replicas=self.replicas,
            meets_slo=decision.meets_slo,
            replanned=self._replan_note,
        )
        if self._replan_note is not None:
            record = replace(record, noteworthy=True)
            self._replan_note = None
        self._pinned_over = None
        self.last = record
        return record

    def _space(
        self, now: float, chosen: BatchConfig, note: str | None
    ) -> tuple[BatchConfig, str | None]:
        """On an engine that reloads for every change, hold a change until the last one
        has had `ChangeCost.spacing_s` to finish and be seen serving: back-to-back
        reloads would queue on the engine and put configs in force that are already
        stale. Free changes (a warm-up is paid per bucket, not per change) pass, and so
        does an operator's pin, or the return from one."""
        spacing_s = self.settings.change_cost.spacing_s
        since_s = now - self._changed_at
        if chosen == self.config or since_s >= spacing_s or self.override is not None:
            return chosen, note
        held = f"change held: the last one is reloading ({since_s:.0f} of {spacing_s:g} s)"
        return self.config, held if note is None else f"{note}; {held}"

    def _noteworthy(self, changed: bool, shadow: ShadowDecision | None) -> bool:
        """Kept records: config changes, a pin set or lifted, mode changes, and shadow
        disagreements."""
        last = self.last
        if last is None or changed or self.mode is not last.mode:
            return True
        if shadow is None:
            return False
        return last.shadow is None or shadow.config != last.shadow.config


def _more_cautious(
    backup: Decision, planned: Decision | None, why: str, backup_spec: str
) -> Decision:
    """In fallback the backup policy decides, but a forecast that still asks for a larger
    cap or a shorter timeout (a declared event, a rising upper bound) is kept: falling
    back must never make the pool less safe."""
    reason = f"fallback to {backup_spec} ({why}): {backup.reason}"
    if planned is None:
        return replace(backup, reason=reason)
    ours, theirs = backup.config, planned.config
    cap = max(ours.max_batch_size, theirs.max_batch_size)
    warm = max(ours.warm_target, theirs.warm_target)
    if cap > ours.max_batch_size:
        reason += f"; keeping cap {cap} that the forecast still asks for"
    if warm > max(cap, ours.warm_target):
        reason += f"; keeping batches up to {warm} warm for the forecast"
    config = replace(
        ours,
        max_batch_size=cap,
        timeout_s=min(ours.timeout_s, theirs.timeout_s),
        warm_max_batch=warm if warm > cap else 0,
    )
    # Replicas too: the planner's count (its floor is the load measured now) is kept.
    asked = [r for r in (backup.replicas, planned.replicas) if r is not None]
    return replace(backup, config=config, reason=reason, replicas=max(asked, default=None))


def _forecast_used(snapshot: Snapshot) -> ForecastUsed | None:
    forecast = snapshot.forecast
    if forecast is None:
        return None
    upper = forecast.upper_rps
    peak = int(np.argmax(upper))
    return ForecastUsed(
        model=forecast.model,
        fallback=forecast.fallback,
        horizon_s=float(forecast.times_s[-1] + forecast.step_s - snapshot.now),
        mean_rps_now=float(forecast.mean_rps[0]),
        upper_rps_now=float(upper[0]),
        peak_upper_rps=float(upper[peak]),
        peak_at_s=float(forecast.times_s[peak] - snapshot.now),
    )
