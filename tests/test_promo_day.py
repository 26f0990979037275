import numpy as np
import pytest
import yaml

from server.cli import main as tidal
from simulations.promo_day import PromoDaySpec, generate_promo_day
from simulations.traces import load_trace


@pytest.fixture(scope="module")
def day():
    return generate_promo_day(PromoDaySpec())


def test_mean_and_peak_match_the_spec(day):
    assert day.counts.size == 86_400
    assert day.counts.mean() == pytest.approx(2000, rel=0.02)
    assert day.expected_rps.max() == pytest.approx(18_000)
    assert day.counts.max() >= 15_000


def test_each_sale_ramps_five_to_ten_x_within_two_minutes(day):
    for sale in day.sales:
        assert 5 <= sale.multiplier <= 10
        assert 60 <= sale.ramp_up_s <= 120
        assert 10 * 60 <= sale.decay_s <= 30 * 60
        start = int(sale.start_s)
        peak = int(sale.start_s + sale.ramp_up_s)
        before = day.expected_rps[start]
        assert day.expected_rps[peak] / before == pytest.approx(sale.multiplier, rel=0.05)


def test_counts_are_over_dispersed(day):
    # Poisson alone gives variance == mean; the generator adds slow multiplicative noise.
    window = day.counts[3 * 3600 : 3 * 3600 + 600].astype(float)
    expected = day.expected_rps[3 * 3600 : 3 * 3600 + 600]
    assert np.var(window - expected) > 3 * expected.mean()


def test_same_seed_same_day():
    a = generate_promo_day(PromoDaySpec(seed=3)).counts
    b = generate_promo_day(PromoDaySpec(seed=3)).counts
    assert np.array_equal(a, b)


def test_trace_command_writes_csv_and_events(tmp_path):
    out = tmp_path / "day.csv"
    assert (
        tidal(
            [
                "trace",
                "promo-day",
                "--out",
                str(out),
                "--mean-rps",
                "500",
                "--peak-rps",
                "6000",
                "--seed",
                "1",
            ]
        )
        == 0
    )
    trace = load_trace(out)
    assert trace.step_s == 1.0 and trace.counts.size == 86_400
    assert trace.counts.mean() == pytest.approx(500, rel=0.03)
    events = yaml.safe_load((tmp_path / "day.events.yaml").read_text())["events"]
    assert [e["name"] for e in events] == ["midnight-sale", "morning-deals", "prime-time-sale"]
    assert events[2]["peak_rps"] == 6000 and events[2]["start"] == "2026-11-27T20:00:00"


def test_trace_command_rejects_a_peak_below_the_mean(tmp_path, capsys):
    assert (
        tidal(
            [
                "trace",
                "promo-day",
                "--out",
                str(tmp_path / "x.csv"),
                "--mean-rps",
                "100",
                "--peak-rps",
                "50",
            ]
        )
        == 2
    )
    assert "peak-rps (50) must exceed mean-rps (100)" in capsys.readouterr().err


def test_shipped_example_is_the_generator_output():
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "promo_day.csv"
    trace = load_trace(example)
    assert np.array_equal(trace.counts, generate_promo_day(PromoDaySpec()).counts)
