"""A latency profile is a monotone fit in batch size wherever it is taken or loaded: one
noisy point never makes a larger batch look faster, per batch or per item."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adaptive.latency import parse_latency_model
from adaptive.latency_fit import isotonic, monotone_table, monotone_times

SIZES = [1, 2, 4, 8, 16, 32, 64]


def physical(sizes, times) -> bool:
    sizes, times = np.asarray(sizes, float), np.asarray(times, float)
    per_item = times / sizes
    return bool(np.all(np.diff(times) >= -1e-12) and np.all(np.diff(per_item) <= 1e-12))


def test_pool_adjacent_violators_by_hand():
    # 3 then 2 violate: pooled into their weighted mean (3 * 1 + 2 * 3) / 4 = 2.25.
    assert isotonic(np.array([1.0, 3.0, 2.0, 4.0]), np.array([1, 1, 3, 1])).tolist() == [
        1.0,
        2.25,
        2.25,
        4.0,
    ]
    assert isotonic(np.array([1.0, 3.0]), np.ones(2), increasing=False).tolist() == [2.0, 2.0]


def test_the_profile_a_busy_machine_took_becomes_physical():
    # Measured live on an oversubscribed 2-core machine (issue 1/5): batch 2 under batch
    # 1, batch 8 over batch 16.
    measured = [0.025, 0.011, 0.020, 0.344, 0.100, 0.150, 0.300]
    fitted = monotone_times(SIZES, measured)
    assert physical(SIZES, fitted)
    assert not physical(SIZES, measured)
    assert fitted[1] >= fitted[0] and fitted[4] >= fitted[3]


def test_a_physical_table_comes_back_unchanged():
    means = [0.010, 0.012, 0.015, 0.020, 0.030, 0.050, 0.090]
    assert monotone_times(SIZES, means) == pytest.approx(means, rel=0, abs=0)
    fitted_means, fitted_p99s = monotone_table(SIZES, means, [m * 1.5 for m in means])
    assert fitted_means == tuple(means)
    assert fitted_p99s == pytest.approx([m * 1.5 for m in means])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(1e-4, 1.0), min_size=1, max_size=10),
    st.lists(st.floats(0.1, 100.0), min_size=10, max_size=10),
)
def test_any_table_fits_physical_with_p99_at_or_above_the_mean(times, weights):
    sizes = [2**i for i in range(len(times))]
    means, p99s = monotone_table(sizes, times, [t * 2 for t in times], weights[: len(times)])
    assert physical(sizes, means)
    assert all(p >= m for p, m in zip(p99s, means, strict=True))
    assert min(means) > 0


def test_a_loaded_profile_is_fitted_and_says_which_points_moved(tmp_path):
    points = [
        {"batch_size": b, "mean_ms": m, "p99_ms": m * 1.2}
        for b, m in zip(SIZES, [25, 11, 20, 344, 100, 150, 300], strict=True)
    ]
    path = tmp_path / "busy.json"
    path.write_text(json.dumps({"points": points}))
    model = parse_latency_model(str(path))
    means = model.mean_s(np.array(SIZES, dtype=float))
    assert physical(SIZES, means)
    assert "monotone fit moved batch 1, 2" in model.describe()
