"""The simulator's shell through random sequences of the actions it supports.

Two of the simulator's per-policy drivers (`simulations.run._PolicyRun`: a simulated
pool, `observe_pool`, the control step) replay the same arrivals on the same jitter
seed, one with a shadow that an operator sets and lifts at random, one with none; both
get the same pins, events and faults (a forecaster whose fits raise). After every step:
the two pools ran the same configs (the shadow never changes what is applied), every
tick kept a record or said why not, a fit that failed never stops later fits, and a
shadow never shares a policy object with the pool's controller.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from adaptive.config import BatchConfig
from adaptive.controller import Override
from adaptive.latency import LinearLatency
from adaptive.specs import build_policy
from forecaster.events import Event
from forecaster.models import SeasonalNaive
from simulations.cli import policy_context
from simulations.engine import PoolSettings
from simulations.run import SimulationSettings, _PolicyRun, _pool
from simulations.traces import CountTrace

LATENCY = LinearLatency(base_s=0.005, per_item_s=0.0004)
POOL = PoolSettings(2, 0.1, warmup_s=2.0)
REFIT_S = 60.0
SHADOWS = ("predictive:forecaster=seasonal-naive", "aimd", "reactive")


class FlakyForecaster:
    """Seasonal-naive whose fits raise while the machine says so."""

    name = "flaky"

    def __init__(self, machine: SimulatedShellMachine) -> None:
        self.machine = machine

    def fit(self, series):
        if self.machine.fits_raise:
            raise np.linalg.LinAlgError("Singular matrix (injected)")
        return SeasonalNaive(10.0).fit(series)


class SimulatedShellMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        trace = CountTrace("flat", 1.0, np.full(60, 100.0))
        self.context = policy_context(trace, LATENCY, POOL)
        self.settings = SimulationSettings(pool=POOL)
        self.fits_raise = False
        self.now = 0.0
        self.rng = np.random.default_rng(0)
        seed = np.random.SeedSequence(0)
        self.runs = [self._run(seed), self._run(seed)]  # [with a shadow at times, without]

    def _run(self, seed) -> _PolicyRun:
        policy = build_policy("predictive:forecaster=seasonal-naive", self.context)
        policy.forecaster = FlakyForecaster(self)
        run = _PolicyRun(policy, _pool(self.settings, LATENCY, seed), self.settings)
        feed = run.controller.feed
        feed.refit_s = REFIT_S  # refits every minute, not every 30: failures within reach
        feed.prime(np.full(7200, 100.0), 0.0)  # two hours of history: it fits at once
        return run

    @property
    def shadowed(self) -> _PolicyRun:
        return self.runs[0]

    @rule(seconds=st.integers(1, 60), rate=st.sampled_from([20, 200, 1500]))
    def serve(self, seconds, rate):
        for _ in range(seconds):
            start, self.now = self.now, self.now + 1.0
            arrivals = np.sort(self.rng.uniform(start, self.now, self.rng.poisson(rate)))
            before = [len(run.records) for run in self.runs]
            for run in self.runs:
                run.tick(start, self.now, arrivals)
            for run, kept in zip(self.runs, before, strict=True):
                last = run.controller.last
                assert last is not None and last.at_s == self.now  # every tick decided
                assert len(run.records) - kept in (0, 1)
                assert last.noteworthy == (len(run.records) > kept)  # kept, or not news

    @rule(spec=st.sampled_from((*SHADOWS, None)))
    def set_shadow(self, spec):
        policy = None if spec is None else build_policy(spec, self.context)
        self.shadowed.controller.set_shadow(policy)

    @rule(max_batch=st.sampled_from([4, 64]), for_s=st.integers(5, 300))
    def pin(self, max_batch, for_s):
        override = Override(BatchConfig(max_batch, 0.003), self.now + for_s, "test")
        for run in self.runs:
            run.controller.pin(override)

    @rule()
    def unpin(self):
        for run in self.runs:
            run.controller.pin(None)

    @rule(multiplier=st.sampled_from([2.0, 8.0]), in_s=st.integers(0, 600))
    def declare_event(self, multiplier, in_s):
        event = Event("sale", self.now + in_s, self.now + in_s + 300, multiplier=multiplier)
        for run in self.runs:
            run.controller.set_events((event,))

    @rule()
    def delete_events(self):
        for run in self.runs:
            run.controller.set_events(())

    @rule()
    def toggle_fits_raise(self):
        self.fits_raise = not self.fits_raise

    @invariant()
    def the_shadow_never_changes_what_the_pool_runs(self):
        shadowed, alone = (run.controller for run in self.runs)
        assert shadowed.config == alone.config
        assert shadowed.replicas == alone.replicas
        changes = [
            [(r.at_s, r.chosen) for r in run.records if r.chosen != r.previous] for run in self.runs
        ]
        assert changes[0] == changes[1]  # (the shadowed run also keeps its disagreements)

    @invariant()
    def a_shadow_decides_with_its_own_policy_and_feed(self):
        controller = self.shadowed.controller
        shadow = controller.shadow
        if shadow is not None:
            assert shadow.policy is not controller.policy
            assert shadow.feed is None or shadow.feed is not controller.feed

    @invariant()
    def fits_go_on_after_a_failure(self):
        feed = self.runs[1].controller.feed
        assert feed._taken is None and feed._job is None  # inline: nothing left hanging

    @precondition(lambda self: not self.fits_raise)
    @rule()
    def a_long_quiet_stretch_refits(self):
        feed = self.runs[1].controller.feed
        fits = feed.fits
        self.serve(seconds=round(2 * REFIT_S), rate=100)
        assert feed.fits > fits and feed.last_fit_error is None  # failures never wedge it


SimulatedShellMachine.TestCase.settings = settings(
    max_examples=10,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_the_simulators_shell_survives_any_sequence_of_the_actions_it_supports = (
    SimulatedShellMachine.TestCase
)
