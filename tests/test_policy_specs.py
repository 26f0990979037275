"""Policy specs against the registry's catalogue (`adaptive.policy_kinds`): every kind
refuses an option it does not know, naming the known ones, and a value no one means
(`max_batch=99999999999`, a batch timeout of hours), naming the bound; a duration
written as a bare number is found, for the shells to warn about."""

import pytest

from adaptive.policy_kinds import POLICY_KINDS, policy_kinds_help
from adaptive.specs import POLICY_FACTORIES, PolicyContext, build_policy
from tidal_base.errors import InvalidInput
from tidal_base.specs import bare_durations, parse_spec

CONTEXT = PolicyContext(slo_s=0.1, workers=4)


def test_the_catalogue_lists_every_kind_the_registry_builds():
    assert list(POLICY_KINDS) == list(POLICY_FACTORIES)


@pytest.mark.parametrize("kind", list(POLICY_KINDS))
def test_every_kind_refuses_an_unknown_option_naming_the_known_ones(kind):
    with pytest.raises(InvalidInput) as refused:
        build_policy(f"{kind}:bogus=1", CONTEXT)
    known = ", ".join(sorted(POLICY_KINDS[kind].keys))
    assert str(refused.value) == (
        f"policy '{kind}:bogus=1': unknown option 'bogus' (known: {known})"
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("static:max_batch=99999999999", "max_batch must be <= 65,536, got 99999999999"),
        ("static:warm=1000000", "warm must be <= 65,536, got 1000000"),
        ("static:timeout=2h", "timeout must be <= 60s, got 2h"),
        ("aimd:timeout=3600", "timeout must be <= 60s, got 3600"),
        ("aimd:step=99999999999", "step must be <= 65,536, got 99999999999"),
        ("aimd:fill=1e300", "fill must be in [0, 1], got 1e300"),
        ("aimd:budget=-1", "budget must be in [0, 1], got -1"),
        ("reactive:max_batch=99999999999", "max_batch must be <= 65,536, got 99999999999"),
        ("hpa:period=99999999999", "period must be <= 30d, got 99999999999"),
        ("hpa:tolerance=5", "tolerance must be in [0, 1], got 5"),
        ("serve-autoscaler:look_back=1e9", "look_back must be <= 30d, got 1e9"),
        ("serve-autoscaler:factor=nan", "factor must be a finite number, got nan"),
        ("predictive:lead=99d", "lead must be <= 30d, got 99d"),
    ],
)
def test_implausible_values_are_refused_naming_the_option_the_value_and_the_bound(spec, message):
    with pytest.raises(InvalidInput) as refused:
        build_policy(spec, CONTEXT)
    assert str(refused.value) == f"policy {spec!r}: {message}"


@pytest.mark.parametrize(
    "spec",
    ["static:max_batch=65536,timeout=60s,warm=65536", "aimd:timeout=20ms", "hpa:period=1d"],
)
def test_the_bounds_themselves_are_accepted(spec):
    build_policy(spec, CONTEXT)


def test_bare_durations_are_found_by_key_and_zero_is_no_mistake():
    spec = parse_spec("static:max_batch=32,timeout=10,warm=64")
    assert bare_durations(spec, POLICY_KINDS["static"].duration_keys()) == [("timeout", "10")]
    for text in ("static:timeout=10ms", "static:timeout=0", "static:max_batch=10"):
        assert bare_durations(parse_spec(text), {"timeout"}) == []
    lead = parse_spec("predictive:lead=auto,step=30,history=6h")
    assert bare_durations(lead, POLICY_KINDS["predictive"].duration_keys()) == [("step", "30")]


def test_the_help_lists_every_kind_with_its_options():
    text = " ".join(policy_kinds_help().split())
    for kind in POLICY_KINDS.values():
        assert f" {kind.name} " in text
        for option in kind.options:
            assert f" {option.usage()}" in text, option.key
