"""What a change costs an engine: a reload delays it, and the controller spaces reloads.

Exact cases by hand for the reload model the simulator runs (`ReloadTracker`) and for the
controller's spacing, then a property: whatever a policy asks, a reloading engine is
never asked to change twice within `ChangeCost.spacing_s`, while a free engine is.
"""

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptive.bus import PoolStats
from adaptive.change_cost import ChangeCost, ReloadTracker
from adaptive.config import BatchConfig
from adaptive.controller import Controller, ControllerSettings, Override
from adaptive.guards import Guardrails
from adaptive.latency import LinearLatency
from adaptive.policy import Decision, Observation, Snapshot
from simulations.engine import PoolSettings, SimulatedPool
from tidal_base.errors import InvalidInput

SMALL, LARGE = BatchConfig(4, 0.002), BatchConfig(32, 0.002)
STATS = PoolStats(Observation(0.0, 1.0, 10, 10, 0, 0, 0.01, 0.02, 2.0, 0.5, 0.1))


def test_a_reload_serves_the_old_config_until_it_is_done():
    tracker = ReloadTracker(3.0, SMALL)
    tracker.request(LARGE, now=10.0)
    assert tracker.in_force(12.9) == SMALL and tracker.reloading
    assert tracker.in_force(13.0) == LARGE and not tracker.reloading
    assert tracker.reloads == 1


def test_a_request_during_a_reload_starts_over_and_going_back_cancels_it():
    tracker = ReloadTracker(3.0, SMALL)
    tracker.request(LARGE, now=0.0)
    tracker.request(BatchConfig(16, 0.002), now=2.0)  # the engine loads the newest
    assert tracker.in_force(4.0) == SMALL
    assert tracker.in_force(5.0) == BatchConfig(16, 0.002)
    tracker.request(LARGE, now=6.0)
    tracker.request(BatchConfig(16, 0.002), now=7.0)  # back to what serves: nothing to load
    assert tracker.in_force(20.0) == BatchConfig(16, 0.002) and tracker.reloads == 3


def test_change_costs_are_validated_and_described():
    assert ChangeCost(reload_s=3.0).spacing_s == 6.0 and ChangeCost(20.0).spacing_s == 0.0
    assert ChangeCost(20.0, 3.0).describe() == "warm-up 20 s per bucket, reload 3 s per change"
    with pytest.raises(InvalidInput, match="reload must be a duration >= 0, got -1"):
        ChangeCost(reload_s=-1.0)
    with pytest.raises(InvalidInput, match="reload must be a finite duration >= 0, got inf"):
        PoolSettings(1, 0.1, reload_s=float("inf"))


def test_the_simulated_pool_runs_a_change_only_after_its_reload():
    pool = SimulatedPool(
        PoolSettings(1, 0.1, reload_s=3.0), LinearLatency(5e-3, 1e-3), np.random.default_rng(0)
    )
    assert pool.serving(SMALL, 0.0) == SMALL
    assert [pool.serving(LARGE, t) for t in (1.0, 3.9, 4.0)] == [SMALL, SMALL, LARGE]
    assert pool.reloads == 1


@dataclass
class Flapping:
    """A policy that asks for whatever its script says, tick by tick."""

    script: list[BatchConfig]
    spec: str = "flapping"

    def initial_config(self) -> BatchConfig:
        return self.script[0]

    def decide(self, snapshot: Snapshot) -> Decision:
        return Decision(self.script[int(snapshot.now) % len(self.script)], "scripted")


def _changes(script: list[BatchConfig], reload_s: float, ticks: int) -> list[int]:
    rails = Guardrails(dwell_s=0.0, max_step=1e6, hysteresis=0.0)
    settings = ControllerSettings(pool="p", reload_s=reload_s, guardrails=rails)
    controller = Controller(Flapping(script), settings)
    return [t for t in range(ticks) if controller.step(float(t), STATS).changed]


def test_a_reloading_engine_is_changed_at_most_once_per_spacing_and_told_why():
    script = [SMALL, LARGE]
    assert _changes(script, 0.0, 8) == [1, 2, 3, 4, 5, 6, 7]  # free: every tick
    # 6 s (2 x 3) after each change, at the first tick the script asks for the other.
    assert _changes(script, 3.0, 20) == [1, 8, 15]
    rails = Guardrails(dwell_s=0.0, max_step=1e6, hysteresis=0.0)
    controller = Controller(
        Flapping(script), ControllerSettings(pool="p", reload_s=3.0, guardrails=rails)
    )
    controller.step(1.0, STATS)
    record = controller.step(2.0, STATS)
    assert record.chosen == LARGE and record.proposed == SMALL
    assert record.guard == "change held: the last one is reloading (1 of 6 s)"


def test_an_operator_pin_is_not_held_by_the_spacing():
    settings = ControllerSettings(pool="p", reload_s=3.0)
    controller = Controller(Flapping([SMALL]), settings)
    controller.step(0.0, STATS)
    controller.pin(Override(LARGE, until_s=100.0))
    assert controller.step(1.0, STATS).chosen == LARGE


@given(
    st.lists(st.sampled_from([SMALL, LARGE, BatchConfig(8, 0.004)]), min_size=1, max_size=12),
    st.sampled_from([0.5, 1.0, 2.5, 4.0]),
)
def test_changes_to_a_reloading_engine_are_always_spaced(script, reload_s):
    changed_at = _changes(script, reload_s, 40)
    gaps = np.diff(changed_at)
    assert (gaps >= 2 * reload_s).all()
