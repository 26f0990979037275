"""Guardrails never lose a warm target: exact cases by hand, then properties over time."""

from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive.config import BatchConfig
from adaptive.guards import Guard, Guardrails

MS = 1e-3


def test_a_clamped_timeout_keeps_the_warm_target():
    # The case: --guard min_timeout=2ms, proposal (64, 0 ms, warm 256).
    guard = Guard(Guardrails(min_timeout_s=2 * MS))
    current = BatchConfig(64, 2 * MS)
    config, note = guard.apply(0.0, current, BatchConfig(64, 0.0, 256))
    assert config == BatchConfig(64, 2 * MS, 256)
    assert note == "clamped to operator bounds"
    config, _ = guard.apply(1.0, current, BatchConfig(64, 0.0, 256), protective=True)
    assert config == BatchConfig(64, 2 * MS, 256)


def test_clamp_bounds_the_warm_target_by_max_batch_only():
    rails = Guardrails(min_batch=8, max_batch=128)
    assert rails.clamp(BatchConfig(64, 0.0, 256)) == BatchConfig(64, 0.0, 128)
    assert rails.clamp(BatchConfig(256, 0.0, 1024)) == BatchConfig(128, 0.0)
    assert rails.clamp(BatchConfig(2, 0.0, 4)) == BatchConfig(8, 0.0)  # warm <= cap: none
    assert rails.clamp(BatchConfig(2, 0.0, 32)) == BatchConfig(8, 0.0, 32)
    assert rails.clamp(BatchConfig(64, 0.0, 100)) == BatchConfig(64, 0.0, 100)


def test_the_cap_step_limit_keeps_the_warm_target():
    guard = Guard(Guardrails(max_step=4.0))
    config, note = guard.apply(0.0, BatchConfig(16, 5 * MS), BatchConfig(256, 5 * MS, 1024))
    assert config == BatchConfig(64, 5 * MS, 1024)
    assert note == "cap step limited to x4"


def test_a_cap_held_for_dwell_still_raises_the_warm_target_at_once():
    guard = Guard(Guardrails(dwell_s=60.0))
    config, note = guard.apply(0.0, BatchConfig(128, 10 * MS), BatchConfig(32, 10 * MS, 512))
    assert config == BatchConfig(128, 10 * MS, 512)
    assert note == "cap 32 held back for dwell (0 of 60 s)"


def test_a_lower_warm_target_waits_for_the_dwell_and_says_so():
    guard = Guard(Guardrails(dwell_s=60.0))
    warm = BatchConfig(64, 10 * MS, 256)
    config, note = guard.apply(0.0, warm, BatchConfig(64, 10 * MS))
    assert config is warm and note == "warm 256 kept for dwell (0 of 60 s)"
    config, _ = guard.apply(30.0, warm, BatchConfig(64, 10 * MS, 128))
    assert config is warm
    config, note = guard.apply(60.0, warm, BatchConfig(64, 10 * MS))
    assert config == BatchConfig(64, 10 * MS, 128) and note is None  # the most cautious


def test_a_config_outside_the_bounds_is_not_held_there_for_the_dwell():
    # In force from before the bounds (or a pin): lowering into the bounds is at once.
    guard = Guard(Guardrails(max_batch=256, max_timeout_s=50 * MS, dwell_s=60.0))
    config, _ = guard.apply(0.0, BatchConfig(1024, 0.8, 2048), BatchConfig(512, 0.8))
    assert config == BatchConfig(256, 50 * MS)


rails_strategy = st.builds(
    lambda lo, span, tlo, tspan, dwell, step, hyst: Guardrails(
        min_batch=lo,
        max_batch=lo + span,
        min_timeout_s=tlo,
        max_timeout_s=tlo + tspan,
        dwell_s=dwell,
        max_step=step,
        hysteresis=hyst,
    ),
    st.integers(1, 64),
    st.integers(0, 4096),
    st.sampled_from([0.0, 0.001, 0.002, 0.01]),
    st.sampled_from([0.0, 0.01, 0.05, 1.0]),
    st.sampled_from([0.0, 5.0, 60.0]),
    st.sampled_from([1.0, 1.5, 2.0, 4.0]),
    st.sampled_from([0.0, 0.1, 0.25]),
)
config_strategy = st.builds(
    BatchConfig,
    st.integers(1, 8192),
    st.sampled_from([0.0, 0.001, 0.002, 0.005, 0.02, 0.05, 0.8]),
    st.one_of(st.just(0), st.integers(1, 16384)),
)
steps_strategy = st.lists(
    st.tuples(st.sampled_from([0.0, 1.0, 10.0, 30.0, 61.0]), config_strategy, st.booleans()),
    min_size=1,
    max_size=25,
)


def inside(rails: Guardrails, config: BatchConfig) -> bool:
    return (
        rails.min_batch <= config.max_batch_size <= rails.max_batch
        and rails.min_timeout_s <= config.timeout_s <= rails.max_timeout_s
        and config.warm_target <= rails.max_batch
    )


@settings(max_examples=300, deadline=None)
@given(rails_strategy, config_strategy, steps_strategy)
def test_guards_never_lose_a_warm_target_and_the_dwell_only_delays_lowering(rails, start, steps):
    guard, current, now = Guard(rails), start, 0.0
    seen: list[tuple[float, int]] = []  # (time, clamped warm target proposed)
    for gap_s, proposal, protective in steps:
        now += gap_s
        wanted = min(proposal.warm_target, rails.max_batch)
        seen.append((now, rails.clamp(proposal).warm_target))
        chosen, _ = guard.apply(now, current, proposal, protective)
        assert inside(rails, chosen)
        # Never below what the proposal asked for (up to the operator's max_batch)...
        assert chosen.warm_target >= wanted
        # ...nor above it and what already ran (a guard never invents warm buckets).
        assert chosen.warm_target <= max(current.warm_target, rails.clamp(proposal).warm_target)
        lowered = chosen.warm_target < min(current.warm_target, rails.max_batch)
        if lowered and not protective and rails.dwell_s > 0:
            # Only after the dwell, and only as far as every proposal within it allowed.
            window = [w for at_s, w in seen if at_s > now - rails.dwell_s]
            assert max(window) <= chosen.warm_target
        current = chosen
