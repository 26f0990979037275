import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive.histogram import RELATIVE_ERROR, LatencyHistogram

samples = st.lists(st.floats(1e-5, 1e3, allow_nan=False), min_size=1, max_size=400)


@settings(max_examples=200, deadline=None)
@given(values=samples, q=st.sampled_from([0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0]))
def test_quantiles_are_within_one_percent_of_nearest_rank(values, q):
    data = np.array(values)
    exact = float(np.quantile(data, q, method="inverted_cdf"))
    estimate = LatencyHistogram.from_samples(data).quantile_s(q)
    assert RELATIVE_ERROR < 0.01
    assert abs(estimate - exact) <= RELATIVE_ERROR * exact * (1 + 1e-9)


@settings(max_examples=50, deadline=None)
@given(a=samples, b=samples)
def test_merging_equals_recording_everything_in_one(a, b):
    merged = LatencyHistogram.from_samples(np.array(a))
    merged.merge(LatencyHistogram.from_samples(np.array(b)))
    whole = LatencyHistogram.from_samples(np.array(a + b))
    assert np.array_equal(merged.counts, whole.counts)
    assert merged.max_s == whole.max_s
    assert merged.summary().p99_s == whole.summary().p99_s


def test_empty_histogram_has_no_quantiles():
    summary = LatencyHistogram().summary()
    assert summary.count == 0 and summary.p99_s is None and summary.mean_s is None
