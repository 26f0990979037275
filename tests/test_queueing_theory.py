"""The engine against queueing theory: M/D/1 and batch-free M/D/c limits."""

import numpy as np
import pytest

from adaptive.config import BatchConfig
from adaptive.latency import LinearLatency
from adaptive.policy import StaticPolicy
from simulations.engine import PoolSettings
from simulations.run import SimulationSettings, simulate
from simulations.traces import CountTrace


@pytest.mark.parametrize("utilisation", [0.5, 0.8])
def test_max_batch_one_matches_md1_mean_wait(utilisation):
    service_s = 0.001
    rate = utilisation / service_s
    trace = CountTrace("poisson", 1.0, np.full(1500, rate))
    report = simulate(
        trace,
        [StaticPolicy(BatchConfig(1, 0.0))],
        SimulationSettings(PoolSettings(workers=1, slo_s=1.0), seed=3),
        LinearLatency(service_s, 0.0),
    )
    # Pollaczek-Khinchine for deterministic service: W = rho * D / (2 * (1 - rho)).
    expected_wait = utilisation * service_s / (2 * (1 - utilisation))
    result = report.results[0]
    measured_wait = result.latency.mean_s - service_s
    assert result.completed == report.requests > 500_000
    assert measured_wait == pytest.approx(expected_wait, rel=0.03)
    assert result.utilization == pytest.approx(utilisation, rel=0.01)
