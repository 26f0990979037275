"""Generate an e-commerce promotion day: a diurnal cycle, flash sales and noisy bursts.

The shape operators fear: traffic that follows the day, then jumps 5-10x within a
minute or two when a scheduled sale opens, and decays over the next 10-30 minutes.
Counts are per second; the sales' schedule is returned as well, because operators know
their calendar and Tidal's forecaster reads it as declared events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from tidal_base.errors import InvalidInput

DAY_S = 86_400


@dataclass(frozen=True, slots=True)
class FlashSale:
    """A scheduled sale: traffic multiplies by `multiplier` at its peak."""

    name: str
    start_s: float
    multiplier: float
    ramp_up_s: float
    hold_s: float
    decay_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.ramp_up_s + self.hold_s + self.decay_s

    def shape(self, t: np.ndarray) -> np.ndarray:
        """0 before the sale, rising smoothly to 1, holding, then decaying to ~0.05."""
        ramp = np.clip((t - self.start_s) / self.ramp_up_s, 0.0, 1.0)
        rising = ramp * ramp * (3.0 - 2.0 * ramp)
        decay_start = self.start_s + self.ramp_up_s + self.hold_s
        decaying = np.exp(-3.0 * np.maximum(t - decay_start, 0.0) / self.decay_s)
        return np.where(t < decay_start, rising, decaying)


DEFAULT_SALES = (
    FlashSale("midnight-sale", 0.0, 9.0, 90.0, 300.0, 1200.0),
    FlashSale("morning-deals", 10 * 3600.0, 8.0, 120.0, 180.0, 900.0),
    FlashSale("prime-time-sale", 20 * 3600.0, 10.0, 60.0, 600.0, 1800.0),
)


@dataclass(frozen=True, slots=True)
class PromoDaySpec:
    """Knobs of the generated day."""

    mean_rps: float = 2000.0
    peak_rps: float = 18000.0
    seed: int = 7
    date: datetime = datetime(2026, 11, 27)
    noise_sigma: float = 0.08
    noise_correlation_s: float = 60.0
    sales: tuple[FlashSale, ...] = DEFAULT_SALES

    def __post_init__(self) -> None:
        if self.mean_rps <= 0:
            raise InvalidInput(f"mean-rps must be > 0, got {self.mean_rps}")
        if self.peak_rps <= self.mean_rps:
            raise InvalidInput(
                f"peak-rps ({self.peak_rps:g}) must exceed mean-rps ({self.mean_rps:g})"
            )


@dataclass(frozen=True)
class PromoDay:
    """Per-second counts, the expected (noise-free) rate, and the sales as scheduled."""

    spec: PromoDaySpec
    counts: np.ndarray
    expected_rps: np.ndarray
    sales: tuple[FlashSale, ...]

    def timestamps(self) -> list[str]:
        return [
            (self.spec.date + timedelta(seconds=int(s))).isoformat()
            for s in range(self.counts.size)
        ]

    def sale_peak_rps(self, sale: FlashSale) -> float:
        start, end = int(sale.start_s), int(min(sale.end_s, DAY_S))
        return float(self.expected_rps[start:end].max())


# Relative load at each hour 00:00..24:00, as e-commerce traffic typically runs.
_HOURLY_LOAD = (
    0.90,
    0.70,
    0.50,
    0.40,
    0.35,
    0.40,
    0.55,
    0.75,
    0.90,
    1.00,
    1.05,
    1.10,
    1.15,
    1.10,
    1.05,
    1.05,
    1.10,
    1.20,
    1.30,
    1.45,
    1.60,
    1.65,
    1.50,
    1.20,
    0.90,
)


def diurnal_profile(t: np.ndarray) -> np.ndarray:
    """Relative load over the day: trough near 04:00, evening peak near 21:00."""
    return np.interp(t / 3600.0, np.arange(len(_HOURLY_LOAD)), _HOURLY_LOAD)


def generate_promo_day(spec: PromoDaySpec) -> PromoDay:
    """The day's expected rate fitted to the spec's mean and peak, then noisy counts."""
    t = np.arange(DAY_S, dtype=np.float64)
    base = diurnal_profile(t)
    sales_shape = _relative_sale_shape(spec.sales, t)
    scale, lift = _fit_mean_and_peak(base, sales_shape, spec.mean_rps, spec.peak_rps)
    expected = scale * base * (1.0 + lift * sales_shape)
    rng = np.random.default_rng(spec.seed)
    noisy = expected * _lognormal_ar1(rng, DAY_S, spec.noise_sigma, spec.noise_correlation_s)
    counts = rng.poisson(noisy).astype(np.int64)
    top = max(s.multiplier for s in spec.sales)
    sales = tuple(
        FlashSale(
            s.name,
            s.start_s,
            1.0 + lift * (s.multiplier - 1.0) / (top - 1.0),
            s.ramp_up_s,
            s.hold_s,
            s.decay_s,
        )
        for s in spec.sales
    )
    return PromoDay(spec, counts, expected, sales)


def _relative_sale_shape(sales: tuple[FlashSale, ...], t: np.ndarray) -> np.ndarray:
    """Sum of sale shapes, each weighted by its lift relative to the biggest sale."""
    top = max(s.multiplier for s in sales)
    shape = np.zeros_like(t)
    for sale in sales:
        shape += (sale.multiplier - 1.0) / (top - 1.0) * sale.shape(t)
    return shape


def _fit_mean_and_peak(
    base: np.ndarray, shape: np.ndarray, mean_rps: float, peak_rps: float
) -> tuple[float, float]:
    """Scale c and lift k with mean(c*base*(1+k*shape)) = mean and its max = peak."""
    peak_at = int(np.argmax(shape))
    for _ in range(5):
        b_peak, g_peak = base[peak_at], shape[peak_at]
        mean_base, mean_lifted = base.mean(), (base * shape).mean()
        denominator = peak_rps * mean_lifted - mean_rps * b_peak * g_peak
        lift = (mean_rps * b_peak - peak_rps * mean_base) / denominator if denominator else -1
        if lift <= 0:
            raise InvalidInput(
                f"peak-rps {peak_rps:g} is too low for mean-rps {mean_rps:g}: the daily "
                "cycle alone would exceed it"
            )
        scale = mean_rps / (mean_base + lift * mean_lifted)
        peak_at = int(np.argmax(base * (1.0 + lift * shape)))
    return scale, lift


def _lognormal_ar1(
    rng: np.random.Generator, n: int, sigma: float, correlation_s: float
) -> np.ndarray:
    """Mean-one multiplicative noise with an AR(1) log: slow swells, not white jitter."""
    if sigma == 0:
        return np.ones(n)
    rho = math.exp(-1.0 / correlation_s)
    shocks = rng.standard_normal(n) * sigma * math.sqrt(1.0 - rho * rho)
    log_noise = np.empty(n)
    log_noise[0] = rng.standard_normal() * sigma
    for i in range(1, n):
        log_noise[i] = rho * log_noise[i - 1] + shocks[i]
    return np.exp(log_noise - 0.5 * sigma * sigma)
