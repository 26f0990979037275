"""The controller owns its state: a shadow forecasts for itself, a policy object decides
for one controller, failed fits never wedge the forecast, a job goes back only to the
controller that asked, zero timings are timings, and warming replicas are not ready.
Each test here failed before its fix (issue 2/5)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_controller import LATENCY, run
from test_controller_api import AUTH, record_traffic, report_forever, running
from test_controller_api import STATIC as STATIC_API
from test_refit_off_loop import PlanningStatic
from virtual_time import run_virtual

from adaptive.bus import WorkerStats
from adaptive.config import BatchConfig
from adaptive.controller import Controller, ControllerSettings
from adaptive.fleet import FleetLimits
from adaptive.forecast_feed import ForecastFeed
from adaptive.latency import TableLatency
from adaptive.learned_latency import ExecutionTimes, LatencyLearner
from adaptive.policy import Decision, StaticPolicy
from adaptive.specs import build_policy
from forecaster.models import SeasonalNaive
from server.bus.local import LocalPoolBus
from server.control import plane as plane_module
from server.control.loop import ControlLoop
from simulations import cli as simulate_cli
from simulations.cli import policy_context
from simulations.engine import PoolSettings
from simulations.traces import CountTrace
from tidal_base.errors import PolicyInUse

STATIC = "static:max_batch=16,timeout=5ms"

# -- 1. a shadow runs with its own forecast feed -------------------------------------


def test_a_predictive_shadow_beside_a_static_policy_forecasts_for_itself_never_applied():
    counts = [400] * 200 + [3000] * 200
    (result,) = run(counts, [STATIC], shadow="predictive")
    shadows = [d.shadow for d in result.decisions if d.shadow is not None]
    assert shadows and all(s.policy.startswith("predictive") for s in shadows)
    assert any("req/s" in s.reason for s in shadows)  # predictive's own reasons
    assert {s.config for s in shadows} != {BatchConfig(16, 0.005)}  # it has views
    assert all(d.chosen == BatchConfig(16, 0.005) for d in result.decisions)
    assert {row.max_batch_size for row in result.timeline} == {16}


def test_simulate_runs_the_issues_shadow_combination_and_writes_its_decisions(tmp_path, capsys):
    trace = tmp_path / "flat.csv"
    rows = "\n".join(f"{s},{300 if s < 300 else 2500}" for s in range(600))
    trace.write_text("timestamp,count\n" + rows + "\n")
    out = tmp_path / "out"
    argv = ["--trace", str(trace), "--policy", "static:max_batch=32,timeout=10ms"]
    argv += ["--shadow", "predictive", "--no-progress", "--out", str(out)]
    assert simulate_cli.main(argv) == 0
    (decisions,) = out.glob("decisions-*.jsonl")
    records = [json.loads(line) for line in decisions.read_text().splitlines()]
    shadows = [r["shadow"] for r in records if r["shadow"]]
    assert shadows and all(s["policy"] == "predictive" for s in shadows)
    assert all(r["chosen"]["max_batch"] == 32 for r in records)


def test_a_shadow_beside_a_forecasting_policy_is_fed_by_its_own_forecaster():
    trace = CountTrace("flat", 1.0, np.full(600, 500.0))
    context = policy_context(trace, LATENCY, PoolSettings(4, 0.1))
    active = build_policy("predictive:forecaster=seasonal-naive", context)
    shadow = build_policy("predictive:forecaster=holt", context)
    controller = Controller(active, ControllerSettings(workers=4), shadow=shadow)
    assert controller.shadow.feed is not None and controller.shadow.feed is not controller.feed
    for second in range(1, 2400):
        record = controller.step(float(second), pool_stats(500, second))
    assert controller.shadow.feed.forecast.model != controller.feed.forecast.model
    assert record.forecast.model == controller.feed.forecast.model


def pool_stats(arrivals: int, second: int):
    from adaptive.bus import observe_pool

    stats = WorkerStats("w", 1.0, arrivals, arrivals, 0, (), 0.0, ((5, 10),), 0.1, 0, 8, (), 1)
    return observe_pool([stats], float(second), 1.0, 1)


# -- 2. a policy object decides for one controller; promotion builds afresh ----------


def test_a_policy_object_decides_for_one_controller_only():
    context = policy_context(CountTrace("x", 1.0, np.full(60, 1.0)), LATENCY, PoolSettings(1, 0.1))
    aimd = build_policy("aimd", context)
    Controller(aimd, ControllerSettings())
    with pytest.raises(PolicyInUse, match="build a fresh one from its spec"):
        Controller(aimd, ControllerSettings())
    static = StaticPolicy(BatchConfig(8, 0.001))  # frozen: no state to leak, may be shared
    Controller(static, ControllerSettings())
    Controller(static, ControllerSettings())


def test_promoting_after_the_gate_installs_a_policy_built_afresh_not_the_replayed_one(
    monkeypatch,
):
    replayed = []
    real_simulate = plane_module.simulate

    def simulate_and_remember(trace, policies, *args, **kwargs):
        replayed.extend(policies)
        return real_simulate(trace, policies, *args, **kwargs)

    monkeypatch.setattr(plane_module, "simulate", simulate_and_remember)

    async def scenario():
        bus = LocalPoolBus()
        async with running(bus) as (control, api):
            await record_traffic(bus, 240, 300)
            gate = await api.post(
                "/v1/pools/p/simulate", json={"candidate": "aimd", "promote": True}, headers=AUTH
            )
            return gate.json(), control.controller.policy

    gate, live = asyncio.run(scenario())
    assert gate["promoted"] is True and live.spec.startswith("aimd")
    assert replayed and all(live is not p for p in replayed)
    assert any(p.spec.startswith("aimd") for p in replayed)


# -- 3. a failed refit is an outcome ---------------------------------------------------


class FlakyForecaster:
    """Seasonal-naive whose fits raise while `failing` (statsmodels' LinAlgError)."""

    name = "flaky"

    def __init__(self) -> None:
        self.failing = True
        self.attempts: list[int] = []

    def fit(self, series):
        self.attempts.append(len(series.counts))
        if self.failing:
            raise np.linalg.LinAlgError("Singular matrix")
        return SeasonalNaive(10.0).fit(series)


@pytest.mark.parametrize("deferred", [False, True], ids=["inline", "on-a-thread"])
def test_a_fit_that_raises_is_counted_backed_off_retried_and_never_wedges(deferred):
    model = FlakyForecaster()
    feed = ForecastFeed(
        model, step_s=1.0, horizon_s=5.0, min_history_s=30, refit_s=60, defer_fits=deferred
    )

    def observe(first: int, last: int) -> None:
        for second in range(first, last + 1):
            feed.observe(float(second), 50)
            job = feed.take_fit_job()
            if job is not None:
                feed.install(job, job.run())

    observe(1, 100)
    assert feed.fit_failures >= 3 and "LinAlgError: Singular matrix" in feed.last_fit_error
    gaps = np.diff(model.attempts)
    assert list(gaps[:3]) == [1, 2, 4]  # backoff doubles from one step
    assert feed.forecast is not None and "fit failed" in feed.forecast.fallback
    model.failing = False
    observe(101, 200)  # the backoff is at most the refit interval: fitted again
    assert feed.fits >= 1 and feed.last_fit_error is None and feed.forecast.fallback is None


def test_the_simulator_replays_a_policy_whose_forecaster_keeps_failing():
    trace = CountTrace("flat", 1.0, np.full(3600, 400.0))
    context = policy_context(trace, LATENCY, PoolSettings(4, 0.1))
    policy = build_policy("predictive", context)
    policy.forecaster = FlakyForecaster()
    from simulations.run import SimulationSettings, simulate

    settings = SimulationSettings(pool=PoolSettings(4, 0.1))
    (result,) = simulate(trace, [policy], settings, LATENCY).results
    assert result.fit_failures > 0 and "LinAlgError" in result.last_fit_error
    assert result.completed > 0


# -- 4. a job goes back only to the controller that asked ----------------------------


def test_a_refit_in_flight_when_the_policy_is_switched_is_dropped_not_installed():
    def controller() -> Controller:
        policy = PlanningStatic(SeasonalNaive(10.0))
        made = Controller(policy, ControllerSettings(pool="p", defer_fits=True))
        made.feed.prime(np.full(3600, 50.0), 0.0)  # enough history: a refit is due
        return made

    async def scenario():
        bus, gate, started = LocalPoolBus(), asyncio.Event(), []

        async def held(job):
            started.append(job)
            await gate.wait()
            return job.run()

        first, second = controller(), controller()
        loop = ControlLoop(first, bus, "c1", run_job=held)
        await loop.tick()  # reads stats from now on
        await bus.publish_worker_stats("p", stats(1))
        await loop.tick()  # the first controller's refit starts, and waits
        await asyncio.sleep(0.01)
        assert len(started) == 1
        loop.swap(second)
        gate.set()
        for _ in range(3):
            await bus.publish_worker_stats("p", stats(1))
            await loop.tick()
            await asyncio.sleep(0.01)
        return first, second, loop.state

    first, second, state = run_virtual(scenario())
    assert state.jobs_dropped == 1
    assert first.feed.fits == 0  # never given back to a replaced controller either
    assert second.feed.fits == 1  # its own refit, started after the swap


def stats(version: int, worker: str = "w", execution=()) -> WorkerStats:
    return WorkerStats(
        worker,
        1.0,
        50,
        50,
        0,
        (),
        0.0,
        ((5, 10),),
        0.1,
        0,
        8,
        (1, 2, 4, 8),
        version,
        execution=execution,
    )


# -- 5. zero timings -------------------------------------------------------------------


def test_a_size_whose_batches_all_timed_zero_leaves_the_learned_model_defined():
    prior = TableLatency((1, 8, 64), (0.001, 0.002, 0.01), (0.002, 0.004, 0.02))
    learner = LatencyLearner(prior)
    learner.observe(1.0, [ExecutionTimes.from_samples(8, [0.0] * 200)])
    model = learner.model()
    assert all(np.isfinite(model.mean_s(np.arange(1.0, 257.0))))
    assert np.isfinite(learner.drift(prior).relative)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 512),
            st.lists(st.sampled_from([0.0, 1e-7, 2e-4, 0.003, 0.05]), min_size=1, max_size=40),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_learner_answers_a_monotone_finite_model_for_any_timings(reports):
    prior = TableLatency((1, 8, 64), (0.001, 0.002, 0.01), (0.002, 0.004, 0.02))
    learner = LatencyLearner(prior)
    for at, (size, samples) in enumerate(reports, start=1):
        learner.observe(float(at), [ExecutionTimes.from_samples(size, samples)])
    sizes = np.arange(1.0, 513.0)
    means = learner.model().mean_s(sizes)
    assert np.all(np.isfinite(means)) and np.all(means > 0)
    assert np.all(np.diff(means) >= -1e-12)  # time per batch never falls
    assert np.isfinite(learner.drift(prior).relative)


# -- 6. warming replicas are not ready -------------------------------------------------


@dataclass
class FleetWatcher:
    """Static batching that remembers the fleet each snapshot showed it."""

    seen: list = field(default_factory=list)
    spec: str = "fleet-watcher"

    def initial_config(self) -> BatchConfig:
        return BatchConfig(8, 0.001)

    def decide(self, snapshot) -> Decision:
        self.seen.append((snapshot.fleet, snapshot.workers))
        return Decision(BatchConfig(8, 0.001), "static", replicas=3)


def test_the_live_fleet_view_counts_a_warming_replica_as_starting_not_ready():
    async def scenario():
        bus, policy = LocalPoolBus(), FleetWatcher()
        settings = ControllerSettings(
            pool="p", workers=3, fleet=FleetLimits(min_replicas=1, max_replicas=4)
        )
        loop = ControlLoop(Controller(policy, settings), bus, "c1")
        await bus.heartbeat("p", "w1", {"config_version": 1}, 30.0)
        await bus.heartbeat("p", "w2", {"config_version": 1}, 30.0)
        warming = {"config_version": 1, "ready": False, "not_ready": "warming up"}
        await bus.heartbeat("p", "w3", warming, 30.0)
        await loop.tick()  # reads stats from now on
        await bus.publish_worker_stats("p", stats(1, "w1"))
        await loop.tick()
        return policy.seen[-1], loop.state

    (fleet, workers), state = run_virtual(scenario())
    assert state.workers_alive == 3 and state.workers_ready == 2
    assert (fleet.ready, fleet.starting, fleet.desired) == (2, 1, 3)
    assert workers == 2  # each ready replica's share of the load


# -- the shadow through the API ---------------------------------------------------------


def test_an_operator_sets_and_lifts_a_shadow_through_the_api_and_it_persists():
    async def scenario():
        bus = LocalPoolBus()
        async with running(bus) as (control, api):
            worker = asyncio.create_task(report_forever(bus))
            set_ = await api.put("/v1/pools/p/shadow", json={"policy": "predictive"}, headers=AUTH)
            while control.controller.last is None or control.controller.last.shadow is None:
                await asyncio.sleep(0.05)
            stored = await bus.load_settings("p")
            typo = await api.put(
                "/v1/pools/p/shadow", json={"policy": "aimd", "polcy": 1}, headers=AUTH
            )
            bad = await api.put("/v1/pools/p/shadow", json={"policy": "aimd:x=1"}, headers=AUTH)
            lifted = await api.put("/v1/pools/p/shadow", json={"policy": None}, headers=AUTH)
            worker.cancel()
            return set_, stored, typo, bad, lifted, control

    set_, stored, typo, bad, lifted, control = asyncio.run(scenario())
    assert set_.status_code == 200 and set_.json()["shadow"] == "predictive"
    assert set_.json()["policy"] == STATIC_API and set_.json()["config"]["max_batch"] == 8
    assert stored["shadow"] == "predictive"
    assert typo.status_code == 422 and "polcy" in typo.text  # an unknown key is refused
    assert bad.status_code == 422 and bad.json()["field"] == "policy"
    assert lifted.json()["shadow"] is None and control.controller.shadow is None
    assert control.loop.state.errors == {} or not any(control.loop.state.errors.values())
