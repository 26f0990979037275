import json

import numpy as np
import pytest

from adaptive.latency import LinearLatency, parse_latency_model
from tidal_base.errors import InvalidInput


def test_linear_spec_is_in_milliseconds():
    model = parse_latency_model("linear:5,0.4")
    assert isinstance(model, LinearLatency)
    assert model.mean_s(np.array([1, 10])) == pytest.approx([0.0054, 0.009])


def test_table_interpolates_and_extrapolates_and_reads_p99(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(
        json.dumps(
            {
                "points": [
                    {"batch_size": 1, "mean_ms": 2.0, "p99_ms": 3.0},
                    {"batch_size": 4, "mean_ms": 5.0, "p99_ms": 6.0},
                    {"batch_size": 8, "mean_ms": 9.0, "p99_ms": 10.0},
                ],
                "memory": {
                    "device_bytes": 1000,
                    "parameter_bytes": 200,
                    "activation_bytes_per_sample": 50,
                },
            }
        )
    )
    model = parse_latency_model(str(path))
    assert model.mean_s(np.array([2, 8, 12])) * 1e3 == pytest.approx([3.0, 9.0, 13.0])
    assert model.memory.max_batch_size == 16
    sigma = model.jitter_sigma(np.array([1]))[0]
    # The lognormal with that sigma has p99 / mean = 1.5.
    assert np.exp(2.3263478740408408 * sigma - sigma**2 / 2) == pytest.approx(1.5, rel=1e-6)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"points": []}, "need one mean time per batch size"),
        ({"points": [{"batch_size": 1}]}, "each point needs batch_size and mean_ms"),
        ({"points": [{"batch_size": 1, "mean_ms": 2, "p99_ms": 1}]}, "p99 .* below mean"),
    ],
)
def test_bad_profiles_are_named(tmp_path, document, message):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InvalidInput, match=message):
        parse_latency_model(str(path))


def test_partial_memory_options_are_refused():
    with pytest.raises(InvalidInput, match="needs parameter_memory, sample_memory"):
        parse_latency_model("linear:5,0.4,device_memory=8GiB")
