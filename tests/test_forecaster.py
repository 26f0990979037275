import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from forecaster.events import Event, EventAware
from forecaster.known import KnownFuture
from forecaster.models import SeasonalNaive
from forecaster.registry import build_forecaster
from forecaster.series import RateSeries, resample_arrivals, resample_counts
from forecaster.smoothing import Holt, HoltWinters, MstlHolt
from server.cli import main as tidal
from tidal_base.errors import InvalidInput

HOUR, DAY = 3600.0, 86400.0


def daily(days: float, step_s: float, noise: float = 0.0, trend: float = 0.0, seed: int = 0):
    t = np.arange(int(days * DAY / step_s)) * step_s
    rng = np.random.default_rng(seed)
    y = 1000 + 400 * np.sin(2 * np.pi * t / DAY) + trend * t / DAY + rng.normal(0, noise, t.size)
    return RateSeries(0.0, step_s, y)


def truth(series: RateSeries, steps: int, trend: float = 0.0) -> np.ndarray:
    t = series.start_s + series.step_s * (len(series) + np.arange(steps))
    return 1000 + 400 * np.sin(2 * np.pi * t / DAY) + trend * t / DAY


@pytest.mark.parametrize("model", [HoltWinters(), MstlHolt(periods_s=(DAY,))])
def test_seasonal_models_recover_a_daily_cycle(model):
    series = daily(5, 600.0, noise=5.0)
    forecast = model.fit(series).predict(144)
    assert forecast.fallback is None
    assert np.abs(forecast.mean - truth(series, 144)).max() < 40  # 10% of the amplitude


def test_holt_follows_a_trend():
    t = np.arange(300.0)
    series = RateSeries(0.0, 60.0, 100 + 2 * t + np.random.default_rng(1).normal(0, 1, t.size))
    forecast = Holt().fit(series).predict(10)
    assert forecast.mean == pytest.approx(100 + 2 * np.arange(300, 310), rel=0.02)


def test_intervals_widen_with_horizon():
    fitted = Holt().fit(daily(1, 60.0, noise=20.0))
    forecast = fitted.predict(60)
    width = forecast.upper - forecast.lower
    assert np.all(np.diff(width) >= -1e-9) and width[-1] > width[0]
    assert np.all(forecast.lower <= forecast.mean) and np.all(forecast.mean <= forecast.upper)


def test_update_matches_a_refit_on_a_clean_series():
    full = daily(4, 600.0, noise=2.0)
    head = full.slice(0, len(full) - 36)
    updated = HoltWinters().fit(head)
    updated.update(full.counts[-36:])
    refit = HoltWinters().fit(full)
    a, b = updated.predict(36).mean, refit.predict(36).mean
    assert np.abs(a - b).max() < 0.02 * 1000


def test_short_histories_fall_back_and_say_so():
    short = daily(0.5, 600.0)
    assert "history shorter than two" in HoltWinters().fit(short).predict(3).fallback
    assert "history not longer than two daily" in MstlHolt().fit(short).predict(3).fallback
    assert "naive (last value)" in SeasonalNaive().fit(short).predict(3).fallback
    longer = daily(3, 600.0)
    assert "daily season only" in MstlHolt().fit(longer).predict(3).fallback


def test_gaps_never_crash():
    series = daily(3, 600.0, noise=5.0)
    counts = series.counts.copy()
    counts[100:130] = np.nan
    fitted = HoltWinters().fit(RateSeries(0.0, 600.0, counts))
    fitted.update(np.array([np.nan, 1000.0, np.nan]))
    assert np.all(np.isfinite(fitted.predict(12).mean))


def test_seasonal_naive_repeats_yesterday():
    series = daily(2, 3600.0)
    forecast = SeasonalNaive().fit(series).predict(24)
    assert forecast.mean == pytest.approx(series.counts[-24:])


def test_event_scales_the_forecast_and_widens_the_band():
    series = daily(1, 60.0, noise=5.0)
    start = series.start_s + len(series) * 60.0 + 600
    event = Event("sale", start, start + 1800, multiplier=5.0, ramp_up_s=60, ramp_down_s=600)
    plain = Holt().fit(series).predict(60)
    declared = EventAware(Holt(), (event,)).fit(series).predict(60)
    inside = (plain.times_s >= start + 60) & (plain.times_s < start + 1200)
    assert declared.mean[inside] == pytest.approx(5 * plain.mean[inside], rel=0.02)
    assert np.all(
        (declared.upper - declared.lower)[inside] > 5 * (plain.upper - plain.lower)[inside]
    )
    assert declared.mean[:5] == pytest.approx(plain.mean[:5])
    assert declared.events == ("sale",)


def test_model_does_not_learn_a_declared_spike_as_normal():
    # A wandering level, so Holt's fitted smoothing is quick to follow what it sees.
    base = 1000.0 + np.cumsum(np.random.default_rng(2).normal(0, 15, 600))
    series = RateSeries(0.0, 60.0, base)
    start = 600 * 60.0
    event = Event("sale", start, start + 1800, multiplier=5.0)
    spike = np.full(30, 5 * base[-1])
    aware, plain = EventAware(Holt(), (event,)).fit(series), Holt().fit(series)
    for fitted in (aware, plain):
        fitted.update(spike)
    # After the event the aware model expects the usual level; the plain one learned 5x.
    assert aware.predict(1).mean[0] == pytest.approx(base[-1], rel=0.05)
    assert plain.predict(1).mean[0] > 3 * base[-1]


def test_rescaled_seasonal_naive_has_yesterdays_shape_at_todays_level():
    """Yesterday's 05:30 step comes again at 05:30, scaled by how today's last hour ran
    against yesterday's same hour."""
    shape = np.where(np.arange(48) >= 11, 3000.0, 2000.0)  # a step at 05:30, half-hours
    series = RateSeries(0.0, 1800.0, np.concatenate([shape, shape[:10] * 1.1]))
    forecast = SeasonalNaive(DAY, rescale_s=HOUR).fit(series).predict(4)
    assert forecast.fallback is None
    assert forecast.mean == pytest.approx([2200.0, 3300.0, 3300.0, 3300.0])
    plain = SeasonalNaive(DAY).fit(series).predict(4)
    assert plain.mean == pytest.approx(shape[10:14])  # yesterday's level


@given(
    season=st.lists(st.floats(1.0, 1e4), min_size=4, max_size=24),
    growth=st.floats(0.25, 4.0),
    window=st.integers(1, 3),
    seasons=st.integers(2, 4),
)
def test_rescaled_seasonal_naive_is_exact_on_a_season_that_grows_by_a_factor(
    season, growth, window, seasons
):
    """Each season the last one times `growth`: the forecast of the next is exact, and
    stays so as steps are absorbed one by one."""
    period = len(season)
    base = np.array(season)
    values = np.concatenate([base * growth**k for k in range(seasons)])
    model = SeasonalNaive(float(period), rescale_s=float(window))
    fitted = model.fit(RateSeries(0.0, 1.0, values))
    expected = base * growth**seasons
    assert fitted.predict(period).mean == pytest.approx(expected, rel=1e-9)
    fitted.update(expected[:1])
    assert fitted.predict(period - 1).mean == pytest.approx(expected[1:], rel=1e-9)


def test_rescaled_seasonal_naive_fills_a_gap_and_says_when_history_is_short():
    values = np.tile([100.0, 200.0, 300.0, 400.0], 3)
    fitted = SeasonalNaive(4.0, rescale_s=2.0).fit(RateSeries(0.0, 1.0, values))
    fitted.update(np.array([np.nan]))  # what it expected there
    assert fitted.predict(3).mean == pytest.approx([200.0, 300.0, 400.0])
    short = SeasonalNaive(4.0, rescale_s=2.0).fit(RateSeries(0.0, 1.0, values[:5]))
    assert short.predict(2).fallback.startswith("not rescaled: history shorter than one")
    with pytest.raises(InvalidInput, match=r"rescale must be in \[0, period"):
        build_forecaster("seasonal-naive:period=1h,rescale=2h")


def test_specs_and_errors():
    assert build_forecaster("holt-winters:seasonal=mul").multiplicative
    assert build_forecaster("seasonal-naive:period=7d").period_s == 7 * DAY
    assert build_forecaster("seasonal-naive:rescale=1h").rescale_s == HOUR
    with pytest.raises(InvalidInput, match="unknown forecaster 'prophet'"):
        build_forecaster("prophet")
    with pytest.raises(InvalidInput, match="unknown option 'alpha'"):
        build_forecaster("holt:alpha=0.3")


@pytest.mark.parametrize(
    ("text", "known"),
    [
        ("holt:alpha=0.3", "holt takes none"),
        ("holt-winters:periode=1d", "seasonal, period"),
        ("seasonal-naive:seasonal=mul", "period, rescale"),
    ],
)
def test_an_unknown_forecaster_option_names_the_known_ones(text, known):
    with pytest.raises(InvalidInput) as refused:
        build_forecaster(text)
    assert str(refused.value).endswith(f"(known: {known})")


def test_auto_picks_and_says_which():
    fitted = build_forecaster("auto").fit(daily(3, 600.0, noise=5.0))
    assert fitted.predict(5).model.startswith("auto: ")


def test_resample_arrivals_counts_per_step():
    series = resample_arrivals(np.array([0.1, 0.5, 1.2, 2.9]), 1.0, duration_s=3.0)
    assert series.counts.tolist() == [2, 1, 1]


def test_counts_resample_to_any_step_spread_over_their_intervals():
    counts = np.array([3.0, 6.0, 9.0, 12.0])  # four 300 s intervals
    assert resample_counts(counts, 300, 600).counts.tolist() == [9, 21]  # whole intervals
    assert resample_counts(counts, 300, 100).counts.tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    # 450 s steps: an interval and a half each; the last partial step is dropped.
    assert resample_counts(counts, 300, 450).counts.tolist() == [6, 12]
    with pytest.raises(InvalidInput, match="longer than the trace's 1200s"):
        resample_counts(counts, 300, 1800)


@given(
    counts=st.lists(st.integers(0, 10_000), min_size=1, max_size=50),
    step_s=st.sampled_from([1.0, 60.0, 300.0]),
    new_step_s=st.sampled_from([0.5, 1.0, 7.0, 60.0, 300.0]),
)
def test_resampling_keeps_every_request_of_the_whole_steps(counts, step_s, new_step_s):
    series = np.array(counts, dtype=np.float64)
    if new_step_s > series.size * step_s:
        return
    resampled = resample_counts(series, step_s, new_step_s)
    covered_s = len(resampled) * new_step_s
    whole, part = divmod(covered_s, step_s)
    expected = (
        series[: int(whole)].sum() + (part / step_s) * series[int(whole) : int(whole) + 1].sum()
    )
    assert resampled.counts.sum() == pytest.approx(expected, rel=1e-9, abs=1e-6)
    assert (resampled.counts >= -1e-9).all()


def test_backtest_command_json(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    series = daily(3, 600.0, noise=20.0, seed=4)
    rows = "".join(f"{i * 600},{max(0.0, c):.0f}\n" for i, c in enumerate(series.counts))
    trace.write_text("timestamp,count\n" + rows)
    argv = [
        "forecast",
        "backtest",
        "--trace",
        str(trace),
        "--step",
        "10m",
        "--horizon",
        "1h",
        "--model",
        "holt",
        "--model",
        "holt-winters",
        "--refit-every",
        "12h",
        "--json",
        "--initial",
        "2d",
        "--out",
        str(tmp_path / "out"),
    ]
    assert tidal(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["step_s"] == 600 and summary["horizon_s"] == 3600 and summary["level"] == 0.9
    assert summary["band"] == "conformal"
    names = [m["model"] for m in summary["models"]]
    assert names == ["seasonal-naive", "holt", "holt-winters"]
    by_name = {m["model"]: m for m in summary["models"]}
    assert by_name["seasonal-naive"]["mase"] == 1.0
    assert by_name["holt-winters"]["mase"] < 1.0
    assert 0.6 < by_name["holt-winters"]["coverage"] <= 1.0
    assert 0.0 < by_name["holt-winters"]["conformal_share"] <= 1.0
    assert (tmp_path / "out" / "backtest.png").stat().st_size > 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "nope"], "unknown forecaster 'nope'"),
        (["--events", "missing.yaml"], "no such events file"),
    ],
)
def test_backtest_bad_input_exits_2(tmp_path, capsys, extra, message):
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,count\n" + "".join(f"{i * 60},{100 + i % 5}\n" for i in range(200)))
    assert tidal(["forecast", "backtest", "--trace", str(trace), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 1000), min_size=1, max_size=60),
    truth_step=st.sampled_from([1.0, 5.0, 60.0]),
    feed_step=st.sampled_from([1.0, 2.5, 10.0, 300.0]),
    seen=st.integers(0, 80),
    steps=st.integers(0, 12),
)
def test_the_oracle_predicts_the_truth_summed_over_each_step(
    counts, truth_step, feed_step, seen, steps
):
    """Each predicted step holds exactly the truth's requests within it (a truth step cut
    by a feed step's edge shared in proportion), and nothing past the truth's end."""
    truth = RateSeries(0.0, truth_step, np.asarray(counts, dtype=np.float64))
    fitted = KnownFuture(truth).fit(RateSeries(0.0, feed_step, np.zeros(seen)))
    forecast = fitted.predict(steps)
    fine = np.repeat(truth.counts / 100, 100)  # the truth spread evenly at 1/100 of a step
    fine_edges = truth_step / 100 * np.arange(fine.size + 1)
    for start, predicted in zip(forecast.times_s, forecast.mean, strict=True):
        inside = np.clip(
            np.minimum(fine_edges[1:], start + feed_step) - np.maximum(fine_edges[:-1], start),
            0,
            truth_step / 100,
        )
        assert predicted == pytest.approx(float(fine @ inside) / (truth_step / 100), abs=1e-6)
