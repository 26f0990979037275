from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive.forecast_feed import ForecastFeed
from forecaster.backtest import BacktestSettings, backtest
from forecaster.conformal import BandCalibrator
from forecaster.forecast import Forecast
from forecaster.known import KnownFuture
from forecaster.models import SeasonalNaive
from forecaster.series import RateSeries
from tidal_base.errors import InvalidInput


def flat(start_s: float, mean: float, half_width: float, steps: int = 1, level: float = 0.5):
    """A forecast of `mean` per step with an analytic band of +- `half_width`."""
    ones = np.ones(steps)
    return Forecast(
        times_s=start_s + 60.0 * np.arange(steps),
        step_s=60.0,
        mean=mean * ones,
        lower=(mean - half_width) * ones,
        upper=(mean + half_width) * ones,
        level=level,
        model="test",
        fitted_at_s=start_s,
    )


def test_three_scores_by_hand():
    calibrator = BandCalibrator(1, window=5, min_scores=3)
    # Mean 100, analytic half-width 20: counts 110, 80, 130 score 0.5, -1.0, 1.5.
    for step, count in enumerate([110, 80, 130]):
        calibrator.record(flat(60.0 * step, 100, 20))
        calibrator.observe(60.0 * step, count)
    calibrated = calibrator.calibrate(flat(180.0, 100, 20))
    # n=3, level 0.5: ranks floor(4 * 0.25) = 1 and ceil(4 * 0.75) = 3 of [-1, 0.5, 1.5].
    assert calibrated.band == "conformal"
    assert calibrated.lower[0] == pytest.approx(100 - 1.0 * 20)
    assert calibrated.upper[0] == pytest.approx(100 + 1.5 * 20)


def test_too_few_scores_keep_the_analytic_band_and_say_so():
    calibrator = BandCalibrator(1, window=5, min_scores=3)
    calibrator.record(flat(0.0, 100, 20))
    calibrator.observe(0.0, 150)
    calibrated = calibrator.calibrate(flat(60.0, 100, 20))
    assert calibrated.band == "analytic: 1 of 3 residuals needed to calibrate"
    assert (calibrated.lower, calibrated.upper) == (flat(60.0, 100, 20).lower, [120])


def test_the_window_forgets_the_oldest_scores():
    calibrator = BandCalibrator(1, window=3, min_scores=3)
    for step, count in enumerate([500, 110, 80, 130]):  # the first score (20.0) falls out
        calibrator.record(flat(60.0 * step, 100, 20))
        calibrator.observe(60.0 * step, count)
    assert calibrator.calibrate(flat(240.0, 100, 20)).upper[0] == pytest.approx(130)


def test_each_horizon_is_scored_on_the_forecast_made_that_far_ahead():
    calibrator = BandCalibrator(2, window=10, min_scores=2)
    # The first step ahead is exact, the second always 40 too low (analytic half-width 10).
    biased = replace(flat(0.0, 100, 10, steps=2), mean=np.array([100.0, 60.0]))
    for step in range(4):
        calibrator.record(replace(biased, times_s=biased.times_s + 60.0 * step))
        calibrator.observe(60.0 * step, 100)
    # Step 0 was predicted 0 steps ahead only; steps 1-3 both 0 and 1 step ahead.
    assert list(calibrator.scores_per_horizon) == [4, 3]
    calibrated = calibrator.calibrate(replace(biased, times_s=biased.times_s + 240.0))
    # Scores: 0 at one step ahead, (100 - 60) / 10 = 4 at two; a band always holds its mean.
    assert calibrated.band == "conformal"
    assert list(calibrated.lower) == [100, 60] and list(calibrated.upper) == [100, 100]


def test_a_horizon_short_of_scores_is_named():
    calibrator = BandCalibrator(3, window=10, min_scores=2)
    for step in range(3):  # two scores at 0 and 1 steps ahead, one at 2
        calibrator.record(flat(60.0 * step, 100, 10, steps=3))
        calibrator.observe(60.0 * step, 100)
    band = calibrator.calibrate(flat(180.0, 100, 10, steps=3)).band
    assert band == "conformal to 2 steps ahead, analytic beyond (too few residuals)"


def test_bad_settings_and_a_step_change_are_refused():
    with pytest.raises(InvalidInput, match="min_scores"):
        BandCalibrator(1, window=5, min_scores=10)
    calibrator = BandCalibrator(1)
    calibrator.record(flat(0.0, 100, 20))
    wrong_step = Forecast(np.array([30.0]), 30.0, *([np.ones(1)] * 3), 0.9, "test", 0.0)
    with pytest.raises(InvalidInput, match=r"steps are 60\.0 s"):
        calibrator.record(wrong_step)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), width=st.floats(0.2, 5.0), level=st.sampled_from([0.8, 0.9]))
def test_on_exchangeable_noise_a_band_covers_its_level_whatever_the_analytic_width(
    seed, width, level
):
    """The analytic band is `width` times the true spread's half-width at `level`; the
    calibrated one covers about `level` out of sample all the same."""
    rng = np.random.default_rng(seed)
    counts = 1000 + 50 * rng.standard_normal(3000)
    calibrator = BandCalibrator(1, window=1000, min_scores=30)
    covered = []
    for step, count in enumerate(counts):
        forecast = calibrator.calibrate(flat(60.0 * step, 1000, 50 * 1.645 * width, level=level))
        calibrator.record(flat(60.0 * step, 1000, 50 * 1.645 * width, level=level))
        if step >= 1000:
            covered.append(forecast.lower[0] <= count <= forecast.upper[0])
        calibrator.observe(60.0 * step, count)
    assert level - 0.04 <= np.mean(covered) <= level + 0.04


def test_backtest_calibrates_a_band_the_model_gets_wrong():
    # Poisson-ish noise ten times the seasonal-naive's analytic guess: its raw band is far
    # too narrow; conformal brings it to the nominal level.
    rng = np.random.default_rng(7)
    series = RateSeries(0.0, 60.0, 1000 + 40 * rng.standard_normal(2000))
    model = SeasonalNaive(60.0)
    raw = BacktestSettings(5, 300, 50, 300, band="analytic")
    conformal = BacktestSettings(5, 300, 50, 300)
    analytic_result, conformal_result = (
        backtest(model, series, raw),
        backtest(model, series, conformal),
    )
    assert 0.85 <= conformal_result.coverage <= 0.95
    assert conformal_result.conformal_share > 0.9 and analytic_result.conformal_share == 0.0
    assert conformal_result.mae == analytic_result.mae  # calibration never moves the mean
    with pytest.raises(InvalidInput, match="band must be conformal or analytic"):
        BacktestSettings(5, 300, 50, 300, band="wide")


def feed_noise(feed: ForecastFeed, seconds: int, seed: int = 3) -> list[str]:
    """Feed one step a second of noisy counts; the band the feed forecast with each step."""
    rng = np.random.default_rng(seed)
    bands = []
    for second in range(1, seconds + 1):
        forecast = feed.observe(float(second), int(rng.poisson(200)))
        bands.append(None if forecast is None else forecast.band)
    return bands


def test_the_controllers_feed_calibrates_once_its_forecasts_have_met_their_actuals():
    feed = ForecastFeed(
        SeasonalNaive(10.0), step_s=1.0, horizon_s=5.0, min_history_s=30, refit_s=20
    )
    bands = feed_noise(feed, 200)
    # 30 steps on the stand-in, then the model's own band until every one of its 7
    # horizons holds 30 scores; then conformal, through refits every 20 steps.
    assert bands[29].startswith("analytic") and feed.forecast.fallback is None
    first = bands.index("conformal")
    assert 30 + 30 <= first <= 30 + 30 + feed.horizon_steps
    assert set(bands[first:]) == {"conformal"}


def test_the_oracle_and_an_analytic_feed_keep_their_own_band():
    truth = RateSeries(0.0, 1.0, np.full(300, 200.0))
    oracle = ForecastFeed(KnownFuture(truth), step_s=1.0, horizon_s=5.0)
    analytic = ForecastFeed(SeasonalNaive(10.0), step_s=1.0, horizon_s=5.0, band="analytic")
    assert set(feed_noise(oracle, 120)) == {"analytic"}
    assert set(feed_noise(analytic, 120)) <= {"analytic", None}


def test_the_feed_refuses_a_band_it_does_not_know():
    with pytest.raises(InvalidInput, match="band must be conformal or analytic, got 'wide'"):
        ForecastFeed(SeasonalNaive(10.0), step_s=1.0, horizon_s=5.0, band="wide")
