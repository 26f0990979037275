"""A live pool control driven through random sequences of operator actions and faults.

Hypothesis's stateful testing runs one `PoolControl` (its `ControlLoop` ticking every
second) on the in-process bus and a virtual clock (looptime), with two simulated
workers reporting every second, and the operator API (HTTP, in process) steering it:
switch policy, pin and unpin, declare and delete events, run the rollout gate and
promote, set and lift the shadow. Faults strike between: fits that raise, workers that
report zero timings, a worker warming (alive, not ready) and leaving, the bus going
away and coming back. The controller's background jobs are held until a rule lets them
finish, so refits and rebuilds are in flight across switches and promotions.

After every step: ticks fail only while the bus is away, and the loop is ready again
once it is back; a feed's refit is never wedged (one taken is one running); no feed
installs more fits than were run for it (a job goes back only to the controller and
feed that asked); no decision comes from a policy object the rollout gate replayed or
another controller claimed; the shadow never changes what is published; config
versions on the bus only grow.
"""

from __future__ import annotations

import asyncio
import collections
import time

import httpx
import looptime
import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from prometheus_client import CollectorRegistry

from adaptive.bus import WorkerStats
from adaptive.controller import RefitJob
from adaptive.latency import parse_latency_model
from adaptive.learned_latency import ExecutionTimes
from server.bus.local import LocalPoolBus
from server.control import plane as plane_module
from server.control.app import create_app
from server.control.metrics import ControllerMetrics
from server.control.plane import PoolControl, PoolPlan

TOKEN = "machine"
AUTH = {"authorization": f"Bearer {TOKEN}"}
STATIC = "static:max_batch=8,timeout=5ms"
POLICIES = (
    STATIC,
    "static:max_batch=32,timeout=10ms",
    "aimd",
    "reactive",
    "predictive:forecaster=seasonal-naive",
    "predictive:forecaster=seasonal-naive",  # twice as likely: a feed to leak into
)
# Seasonal-naive fits in microseconds; Holt on two hours of seconds takes about 12 s of
# CPU, which would make this test minutes long without testing anything more.
SHADOWS = ("predictive:forecaster=seasonal-naive", "aimd", "reactive")


class FlakyBus:
    """The in-process bus, unreachable while `down` (every call raises, as Redis's
    client does when the server is gone)."""

    def __init__(self) -> None:
        self.inner = LocalPoolBus()
        self.down = False

    def __getattr__(self, name: str):
        attribute = getattr(self.inner, name)
        if not callable(attribute):
            return attribute

        def call(*args, **kwargs):
            if self.down:
                raise ConnectionError("bus unreachable (the test took it away)")
            return attribute(*args, **kwargs)

        return call


class QuickRebuilds(PoolControl):
    """A pool control whose table rebuilds answer the plan's (cached) table at once: a
    real rebuild takes about 12 s of CPU, and what is tested here is who gets it."""

    def _compile_table(self, latency, workers, slo_s):
        return super()._compile_table(self.plan.latency, workers, slo_s)


class ControlPlaneMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = looptime.new_event_loop(start=0.0)
        self.bus = FlakyBus()
        self.replayed: list[object] = []
        self.held: list[tuple[object, asyncio.Event]] = []  # jobs waiting to finish
        self.runs = collections.Counter()  # refits run per feed (kept alive: ids never reused)
        self.fits_raise = False
        self.zero_timings = False
        self.warming = False
        self.second_worker = True
        self.versions: list[int] = []
        self.errors_while_up = 0
        self._spy_on_the_gate()
        self.run(self._start())

    # -- set-up and the world ---------------------------------------------------------

    def _spy_on_the_gate(self) -> None:
        """Remember the policies the rollout gate replays: none may ever decide live."""
        self._real_simulate = real = plane_module.simulate

        def simulate(trace, policies, *args, **kwargs):
            self.replayed.extend(policies)
            return real(trace, policies, *args, **kwargs)

        plane_module.simulate = simulate

    def run(self, coroutine):
        return self.loop.run_until_complete(coroutine)

    async def _start(self) -> None:
        now = int(time.time())
        for second in range(now - 7200, now):  # two hours recorded: forecasts fit at once
            report = WorkerStats("w1", 1.0, 300, 300, 0, (), 0.0, (), 0.0, 0, 8, (), 1)
            await self.bus.inner.publish_worker_stats("p", report, at_s=second)
        plan = PoolPlan(
            pool="p",
            policy=STATIC,
            latency=parse_latency_model("linear:5,0.4"),
            tick_s=1.0,
            workers=2,
            shadow="predictive:forecaster=seasonal-naive",
        )
        registry = CollectorRegistry()
        metrics = ControllerMetrics(registry)
        self.control = QuickRebuilds(plan, self.bus, "c1", metrics.observe, run_job=self._held)
        self.control.prepare()
        await self.control.start()
        app = create_app({"p": self.control}, registry, metrics, TOKEN)
        self.api = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api")
        await self._serve(3)

    async def _held(self, job) -> object:
        """The controller's job, run when a rule lets held jobs finish."""
        release = asyncio.Event()
        self.held.append((job, release))
        await release.wait()
        if isinstance(job, RefitJob):
            self.runs[job.feed] += 1
            if self.fits_raise:
                raise np.linalg.LinAlgError("Singular matrix (injected)")
        return job.run()

    async def _serve(self, seconds: int) -> None:
        """Workers report for `seconds` while the control loop ticks."""
        for _ in range(seconds):
            if not self.bus.down:
                await self._report()
            errors_before = sum(self.control.loop.state.errors.values())
            await asyncio.sleep(1.0)
            if not self.bus.down:
                self.errors_while_up += sum(self.control.loop.state.errors.values()) - errors_before
            await self._check_tick()

    async def _report(self) -> None:
        version = self.versions[-1] if self.versions else 1
        execution = (
            ExecutionTimes.from_samples(8, [0.0] * 5 if self.zero_timings else [0.004] * 5),
        )
        workers = ("w1", "w2") if self.second_worker else ("w1",)
        for name in workers:
            warming = self.warming and name == "w2"
            info = {"config_version": version, "ready": not warming}
            if warming:
                info["not_ready"] = "warming up"
            await self.bus.heartbeat("p", name, info, 3.0)
            report = WorkerStats(
                name,
                1.0,
                150,
                150,
                0,
                (),
                0.0,
                ((1, 150),),
                0.2,
                0,
                8,
                (1, 2, 4, 8),
                version,
                execution=execution,
            )
            await self.bus.publish_worker_stats("p", report)

    async def _check_tick(self) -> None:
        """What each tick must leave: the bus's versions only grow, the shadow is never
        published, decisions come from the controller's own, fresh policy."""
        if self.bus.down:
            return
        stored = await self.bus.inner.current_config("p")
        if stored is not None:
            if self.versions:
                assert stored.version >= self.versions[-1], "a config version went back"
            self.versions.append(stored.version)
        controller = self.control.controller
        record = controller.last
        if record is not None:
            assert record.policy == controller.spec
        static = controller.spec.startswith("static:") and controller.override is None
        if (
            static
            and record is not None
            and controller.config != controller.policy.initial_config()
        ):
            # After a switch the config in force carries over and the guards may hold it
            # for their dwell, and say so; nothing else may keep a static pool off its config.
            assert record.guard, f"a static pool runs {controller.config}: the shadow's?"

    # -- operator actions (the API) --------------------------------------------------

    async def _call(self, method: str, path: str, **kwargs) -> httpx.Response:
        response = await self.api.request(method, f"/v1/pools/p{path}", headers=AUTH, **kwargs)
        if self.bus.down:
            assert response.status_code in (200, 503, 409), response.text
        else:
            assert response.status_code == 200, response.text
        await self._serve(1)
        return response

    @rule(spec=st.sampled_from(POLICIES))
    def switch_policy(self, spec):
        self.run(self._call("PUT", "/policy", json={"policy": spec}))

    @rule(max_batch=st.sampled_from([4, 16, 64]))
    def pin(self, max_batch):
        body = {"max_batch": max_batch, "timeout_ms": 3, "duration": "1h", "reason": "test"}
        self.run(self._call("PUT", "/override", json=body))

    @rule()
    def unpin(self):
        self.run(self._call("DELETE", "/override"))

    @rule(multiplier=st.sampled_from([2.0, 5.0]))
    def declare_event(self, multiplier):
        start = time.time() + 60
        event = {"name": "sale", "start": start, "end": start + 600, "multiplier": multiplier}
        self.run(self._call("POST", "/events", json={"events": [event]}))

    @rule()
    def delete_events(self):
        self.run(self._call("DELETE", "/events"))

    @precondition(lambda self: not self.bus.down)
    @rule(candidate=st.sampled_from(("aimd", "static:max_batch=16,timeout=5ms", "reactive")))
    def gate_and_promote(self, candidate):
        body = {"candidate": candidate, "hours": 0.05, "promote": True}
        self.run(self._call("POST", "/simulate", json=body))

    @rule(spec=st.sampled_from((*SHADOWS, None)))
    def set_shadow(self, spec):
        self.run(self._call("PUT", "/shadow", json={"policy": spec}))

    # -- faults and the world ----------------------------------------------------------

    @rule(seconds=st.integers(1, 20))
    def serve(self, seconds):
        self.run(self._serve(seconds))

    @rule()
    def finish_jobs(self):
        held, self.held = self.held, []
        for _, release in held:
            release.set()
        self.run(self._serve(2))

    @rule(fault=st.sampled_from(("fits_raise", "zero_timings", "warming", "second_worker")))
    def toggle(self, fault):
        """Fits that raise, zero timings, a worker warming (alive, not ready), a worker
        gone: on or off."""
        setattr(self, fault, not getattr(self, fault))

    @rule()
    def bus_away_and_back(self):
        self.bus.down = True
        self.run(self._serve(3))
        self.bus.down = False
        self.run(self._serve(4))  # a backoff of at most 4 s after 2 failures
        assert self.control.loop.state.ready, self.control.loop.state.last_error

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def ticks_fail_only_for_injected_faults(self):
        assert self.errors_while_up == 0, self.control.loop.state.errors

    @invariant()
    def no_refit_is_wedged(self):
        controller = self.control.controller
        in_flight = {id(job.feed) for job, _ in self.held if isinstance(job, RefitJob)}
        shadow = controller.shadow
        for feed in filter(None, (controller.feed, shadow.feed if shadow else None)):
            taken = feed._taken is not None
            assert not taken or id(feed) in in_flight, "a refit was taken and never runs"

    @invariant()
    def fits_go_only_to_the_feed_that_asked(self):
        controller = self.control.controller
        shadow = controller.shadow
        for feed in filter(None, (controller.feed, shadow.feed if shadow else None)):
            installed = feed.fits + feed.fit_failures
            assert installed <= self.runs[feed], "a feed installed a fit run for another"

    @invariant()
    def decisions_come_from_this_controllers_own_fresh_policy(self):
        controller = self.control.controller
        deciding = [(controller.policy, controller)]
        if controller.shadow is not None:
            deciding.append((controller.shadow.policy, controller.shadow))
        for policy, owner in deciding:
            assert all(policy is not p for p in self.replayed), "a replayed policy decides live"
            serial = getattr(policy, "_tidal_controller", owner.serial)
            assert serial == owner.serial, "a policy claimed by another controller decides"

    def teardown(self):
        async def stop():
            for _, release in self.held:
                release.set()
            await self.api.aclose()
            await self.control.stop()

        try:
            self.run(stop())
        finally:
            plane_module.simulate = self._real_simulate
            self.loop.close()


ControlPlaneMachine.TestCase.settings = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_a_live_pool_control_survives_any_sequence_of_actions_and_faults = ControlPlaneMachine.TestCase
