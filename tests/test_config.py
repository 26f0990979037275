"""BatchConfig: validation, one normal form for "no warm-ahead", the API's dict round trip."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adaptive.config import BatchConfig
from adaptive.decisions import config_dict
from adaptive.policy import Observation
from tidal_base.errors import InvalidInput
from tidal_base.values import evolve

caps = st.integers(1, 8192)
# The API's resolution: config_dict writes the timeout in ms with 3 decimals.
timeouts_s = st.integers(0, 2_000_000).map(lambda us: (us / 1e3) / 1e3)
warms = st.integers(0, 16384)
configs = st.builds(BatchConfig, caps, timeouts_s, warms)


def from_config_dict(d: dict[str, float]) -> BatchConfig:
    """How the control API and the settings store read `config_dict` back."""
    return BatchConfig(int(d["max_batch"]), d["timeout_ms"] / 1e3, int(d["warm_max_batch"]))


def test_no_warm_ahead_has_one_spelling():
    plain = BatchConfig(64, 0.0)
    assert BatchConfig(64, 0.0, 64) == plain == BatchConfig(64, 0.0, 32)
    assert BatchConfig(64, 0.0, 64).warm_max_batch == 0
    assert hash(BatchConfig(64, 0.0, 16)) == hash(plain)
    assert BatchConfig(64, 0.0, 256).warm_max_batch == 256 != plain
    assert BatchConfig(64, 0.0, 256).warm_target == 256
    assert BatchConfig(64, 0.0, 16).warm_target == 64


def test_replace_renormalises_against_the_new_cap():
    warm = BatchConfig(64, 0.01, 256)
    assert dataclasses.replace(warm, max_batch_size=512) == BatchConfig(512, 0.01)
    assert dataclasses.replace(warm, timeout_s=0.002) == BatchConfig(64, 0.002, 256)


def test_describe_shows_warm_only_above_the_cap():
    assert BatchConfig(32, 0.01, 32).describe() == "max_batch=32,timeout=10ms"
    assert BatchConfig(32, 0.01, 128).describe() == "max_batch=32,timeout=10ms,warm=128"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 0.01), "max_batch_size must be >= 1, got 0"),
        ((True, 0.01), "max_batch_size must be an integer, got True"),
        ((8, -1.0), "timeout must be a finite value >= 0"),
        ((8, float("nan")), "timeout must be a finite value >= 0"),
        ((8, 0.01, -1), "warm_max_batch must be an integer >= 0, got -1"),
        ((8, 0.01, True), "warm_max_batch must be an integer >= 0, got True"),
        ((8, 0.01, 16.0), "warm_max_batch must be an integer >= 0, got 16.0"),
    ],
)
def test_bad_values_name_the_field(args, message):
    with pytest.raises(InvalidInput, match=message):
        BatchConfig(*args)


@given(configs)
def test_round_trip_through_config_dict_is_identity(config):
    back = from_config_dict(config_dict(config))
    assert back == config
    assert back.warm_max_batch == config.warm_max_batch


@given(configs, configs)
def test_equal_exactly_when_they_run_the_same(a, b):
    runs_the_same = (a.max_batch_size, a.timeout_s, a.warm_target) == (
        b.max_batch_size,
        b.timeout_s,
        b.warm_target,
    )
    assert (a == b) == runs_the_same


@given(rate=st.floats(0, 1e6), queue=st.integers(0, 10**6))
def test_evolve_is_dataclasses_replace(rate, queue):
    seen = Observation(10.0, 1.0, 5, 4, 0, 1, 0.01, 0.02, 2.0, 0.5, 0.3, 2, 0.1)
    fast = evolve(seen, rate_rps=rate, queue_depth=queue)
    assert fast == dataclasses.replace(seen, rate_rps=rate, queue_depth=queue)
    assert type(fast) is Observation and seen.rate_rps is None  # the original is kept


def test_evolve_runs_post_init_where_a_class_has_one_and_refuses_unknown_fields():
    # BatchConfig normalises warm_max_batch in __post_init__: evolve must not skip it.
    assert evolve(BatchConfig(32, 0.01, 64), warm_max_batch=16) == BatchConfig(32, 0.01)
    with pytest.raises(TypeError, match="no field 'cap'"):
        evolve(Observation(0.0, 1.0, 0, 0, 0, 0, None, None, None, None, 0.0), cap=3)
