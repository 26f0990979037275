"""The config optimiser: given a load, the batch config that meets the SLO at least cost.

Queueing formulas for batch service with timeouts, many workers and jitter are
approximations at best, so Tidal does not guess: a `PerformanceTable` holds, for every
candidate config and a grid of arrival rates, the p99, mean latency and GPU busy
seconds per request that the simulator's engine measured under Poisson load
(`simulations.calibration` compiles it once per latency model and pool). At run time
the optimiser only interpolates and ranks, in microseconds:

1. meet the p99 SLO with a safety margin (aim at `margin * slo`);
2. among those, spend the fewest GPU busy seconds per request;
3. among near-ties (within 2%), take the lowest mean latency.
When nothing meets the SLO it takes the lowest predicted p99, and says so.

It predicts only what the table measured: a config with a cap above the table's largest,
or a timeout outside the range measured for its cap, is predicted as unknown (infinite
p99 and cost), never as the table's nearest edge, and `outside` says why in words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from adaptive.config import BatchConfig
from tidal_base.errors import InvalidInput
from tidal_base.units import format_duration

COST_TIE = 1.02
"""Costs within 2% count as equal; the lower mean latency wins."""
MEAN_TIE = 1.02
"""Mean latencies within 2% are a tie too: the smaller cap wins."""

RATE_BIN = 1.005
"""Choices are cached per 0.5% band of rate, evaluated at the band's upper edge."""


@dataclass(frozen=True)
class PerformanceTable:
    """Measured behaviour of candidate configs (rows) over arrival rates (columns)."""

    rates_rps: np.ndarray
    caps: np.ndarray
    timeouts_s: np.ndarray
    p99_s: np.ndarray
    mean_latency_s: np.ndarray
    busy_per_request_s: np.ndarray
    workers: int
    description: str

    def __post_init__(self) -> None:
        shape = (self.caps.size, self.rates_rps.size)
        for name in ("p99_s", "mean_latency_s", "busy_per_request_s"):
            if getattr(self, name).shape != shape:
                raise InvalidInput(f"performance table: {name} must have shape {shape}")
        if np.any(np.diff(self.rates_rps) <= 0):
            raise InvalidInput("performance table: rates must be strictly increasing")

    def at(self, rate_rps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(p99, mean latency, busy per request) of every config at `rate_rps`,
        interpolated in log-rate; inf where a neighbour cannot keep up. Past the grid's
        ends it answers for the end (the optimiser checks `rates_rps[-1]` itself)."""
        rates = self.rates_rps
        if rate_rps <= rates[0]:
            return self.p99_s[:, 0], self.mean_latency_s[:, 0], self.busy_per_request_s[:, 0]
        if rate_rps >= rates[-1]:
            return self.p99_s[:, -1], self.mean_latency_s[:, -1], self.busy_per_request_s[:, -1]
        hi = int(np.searchsorted(rates, rate_rps))
        lo = hi - 1
        w = math.log(rate_rps / rates[lo]) / math.log(rates[hi] / rates[lo])
        return tuple(_blend(a[:, lo], a[:, hi], w) for a in self._metrics())  # type: ignore[return-value]

    def _metrics(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.p99_s, self.mean_latency_s, self.busy_per_request_s


def _blend(lo: np.ndarray, hi: np.ndarray, w: float) -> np.ndarray:
    finite = np.isfinite(lo) & np.isfinite(hi)
    return np.where(finite, (1 - w) * np.where(finite, lo, 0) + w * np.where(finite, hi, 0), np.inf)


@dataclass(frozen=True, slots=True)
class Alternative:
    """One candidate the optimiser weighed: its predicted p99 and GPU cost."""

    config: BatchConfig
    predicted_p99_s: float
    busy_per_request_s: float
    mean_latency_s: float

    def to_dict(self) -> dict[str, object]:
        """The candidate as the decision log keeps it (JSON): cap, timeout (ms), predicted p99 and
        busy time per request (ms; None where unknown). The mean latency is not in it."""
        return {
            "max_batch": self.config.max_batch_size,
            "timeout_ms": round(self.config.timeout_s * 1e3, 3),
            "predicted_p99_ms": _ms(self.predicted_p99_s),
            "busy_ms_per_request": _ms(self.busy_per_request_s),
        }


def _check_rates(*rates_rps: float) -> None:
    """A NaN or infinite rate is a bug upstream (a forecast or an observation), refused
    here by name rather than failing deep inside the ranking."""
    for rate_rps in rates_rps:
        if not math.isfinite(rate_rps):
            raise ValueError(f"optimiser: arrival rate must be finite, got {rate_rps}")


_LOG_RATE_BIN = math.log(RATE_BIN)


def _band(rate_rps: float) -> int:
    return math.ceil(math.log(max(rate_rps, 1e-9)) / _LOG_RATE_BIN)


def _ms(value_s: float) -> float | None:
    return round(value_s * 1e3, 3) if math.isfinite(value_s) else None


@dataclass(frozen=True, slots=True)
class Choice:
    """The optimiser's answer for one rate, with the best alternative of each cap."""

    chosen: Alternative
    meets_slo: bool
    rate_rps: float
    alternatives: tuple[Alternative, ...]

    @property
    def config(self) -> BatchConfig:
        """The chosen config."""
        return self.chosen.config


@dataclass
class ConfigOptimizer:
    """Ranks a table's configs at a rate; deterministic, cached per rate band."""

    table: PerformanceTable
    slo_s: float
    margin: float = 0.8
    _cache: dict[tuple[int, ...], Choice] = field(default_factory=dict, repr=False)

    _predictions: dict[tuple[int, BatchConfig], Alternative] = field(
        default_factory=dict, repr=False
    )
    # The table interpolated at a rate band's edge: bands recur tick after tick.
    _at_band: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False
    )

    def __post_init__(self) -> None:
        if not 0 < self.margin <= 1:
            raise InvalidInput(f"margin must be in (0, 1], got {self.margin}")
        self.largest_cap = int(self.table.caps.max())
        self.target_p99_s = self.margin * self.slo_s
        caps = self.table.caps
        # Each row's cap as an index into the distinct caps, and the rows in order:
        # what `_best_per_cap` sorts by, computed once.
        self._cap_values = np.unique(caps)
        self._cap_group = np.searchsorted(self._cap_values, caps)
        self._row_index = np.arange(caps.size)
        self._row_configs = [
            BatchConfig(int(c), float(t)) for c, t in zip(caps, self.table.timeouts_s, strict=True)
        ]

    def choose(
        self, rate_rps: float, min_cap: int = 1, spread: tuple[float, float] | None = None
    ) -> Choice:
        """The config for `rate_rps` among those with max batch >= `min_cap`.

        With `spread=(low, high)`, the rates the config will likely see before it can next
        change: it must meet the target at all three, and its cost is their average, so a
        load that swings does not pick a config that is cheap only at one end."""
        low, high = spread if spread is not None else (rate_rps, rate_rps)
        _check_rates(rate_rps, low, high)
        bands = (_band(min(low, rate_rps)), _band(rate_rps), _band(max(high, rate_rps)))
        key = (*bands, min(min_cap, self.largest_cap))
        choice = self._cache.get(key)
        if choice is None:
            choice = self._rank(bands, key[-1])
            self._cache[key] = choice
        return choice

    def capacity_rps(self, cap: int) -> float:
        """The highest grid rate at which some config with max batch `cap` meets the target."""
        rows = self.table.caps == cap
        ok = (self.table.p99_s[rows] <= self.target_p99_s).any(axis=0)
        return float(self.table.rates_rps[ok].max()) if ok.any() else 0.0

    def _rank(self, bands: tuple[int, int, int], min_cap: int) -> Choice:
        """The choice over three rate bands (low, now, high), at each band's upper edge."""
        p99, mean, busy = self._over(bands)
        allowed = self.table.caps >= min_cap
        within_grid = RATE_BIN ** bands[-1] <= self.table.rates_rps[-1]
        feasible = allowed & (p99 <= self.target_p99_s) & within_grid
        if feasible.any():
            near = feasible & (busy <= busy[feasible].min() * COST_TIE)
            # Caps above the batches the load forms tie on cost and latency up to noise;
            # the smallest of them warms least and moves least from tick to tick.
            calm = np.flatnonzero(near & (mean <= mean[near].min() * MEAN_TIE))
            index = int(calm[np.lexsort((mean[calm], self.table.caps[calm]))[0]])
        else:
            index = self._best_effort(p99, allowed)
        return Choice(
            self._alternative(index, p99, mean, busy),
            bool(feasible.any()),
            RATE_BIN ** bands[1],
            self._best_per_cap(p99, mean, busy),
        )

    def _at(self, band: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        at = self._at_band.get(band)
        if at is None:
            at = self._at_band[band] = self.table.at(RATE_BIN**band)
        return at

    def _over(self, bands: tuple[int, int, int]) -> tuple[np.ndarray, ...]:
        """Worst p99, mean latency and mean cost of every config over the rate bands."""
        if bands[0] == bands[2]:
            return self._at(bands[1])
        (p0, m0, b0), (p1, m1, b1), (p2, m2, b2) = (self._at(b) for b in bands)
        # What np.max and np.mean over the stacked three compute, in the same order of
        # operations, without stacking them.
        return np.maximum(np.maximum(p0, p1), p2), (m0 + m1 + m2) / 3, (b0 + b1 + b2) / 3

    def _best_effort(self, p99: np.ndarray, allowed: np.ndarray) -> int:
        """Nothing meets the SLO: the lowest finite p99, else the most throughput (the
        largest cap, dispatching at once)."""
        finite = np.flatnonzero(allowed & np.isfinite(p99))
        if finite.size:
            return int(finite[np.argmin(p99[finite])])
        rows = np.flatnonzero(allowed)
        order = np.lexsort((self.table.timeouts_s[rows], -self.table.caps[rows]))
        return int(rows[order[0]])

    def predicted_p99_s(self, config: BatchConfig, rate_rps: float) -> float:
        """The table's p99 for the row nearest `config` (see `predict`)."""
        return self.predict(config, rate_rps).predicted_p99_s

    def outside(self, config: BatchConfig) -> str | None:
        """Why the table cannot predict `config`, in words; None when it can."""
        if config.max_batch_size > self.largest_cap:
            return (
                f"batch {config.max_batch_size} is outside the planner's table "
                f"(<= {self.largest_cap})"
            )
        timeouts_s = self.table.timeouts_s[self._rows(config.max_batch_size)]
        shortest, longest = float(timeouts_s.min()), float(timeouts_s.max())
        if not shortest <= config.timeout_s <= longest:
            measured = f"<= {format_duration(longest)}"
            if shortest > 0:
                measured = f"{format_duration(shortest)} to {format_duration(longest)}"
            return (
                f"timeout {format_duration(config.timeout_s)} is outside the planner's "
                f"table ({measured})"
            )
        return None

    def predict(self, config: BatchConfig, rate_rps: float) -> Alternative:
        """The table's prediction for `config` at `rate_rps`: the row of the smallest
        cap in the table that holds it (its bucket), with the nearest timeout; unknown
        (infinite p99 and cost) for a config `outside` the table. Cached per rate band."""
        _check_rates(rate_rps)
        band = _band(rate_rps)
        # Keyed by the whole config: the answer carries it, and one cached for another
        # warm target would hand the caller a warm target it never asked for.
        key = (band, config)
        predicted = self._predictions.get(key)
        if predicted is None:
            predicted = self._predictions[key] = self._predict(config, RATE_BIN**band)
        return predicted

    def _predict(self, config: BatchConfig, rate_rps: float) -> Alternative:
        if self.outside(config) is not None:
            return Alternative(config, math.inf, math.inf, math.inf)
        p99, mean, busy = self.table.at(rate_rps)
        rows = self._rows(config.max_batch_size)
        row = rows[np.argmin(np.abs(self.table.timeouts_s[rows] - config.timeout_s))]
        return Alternative(config, float(p99[row]), float(busy[row]), float(mean[row]))

    def _rows(self, cap: int) -> np.ndarray:
        """The rows of the smallest table cap >= `cap` (at most the largest cap)."""
        caps = self.table.caps
        return np.flatnonzero(caps == caps[caps >= min(cap, self.largest_cap)].min())

    def _alternative(self, i: int, p99: np.ndarray, mean: np.ndarray, busy: np.ndarray):
        return Alternative(self._row_configs[i], float(p99[i]), float(busy[i]), float(mean[i]))

    def _best_per_cap(self, p99, mean, busy) -> tuple[Alternative, ...]:
        """Per cap, in increasing order: its cheapest row that meets the target, else its
        lowest p99; ties to the first row. One sort rather than a loop over caps."""
        ok = p99 <= self.target_p99_s
        group = self._cap_group
        order = np.lexsort((self._row_index, np.where(ok, busy, p99), ~ok, group))
        firsts = order[np.r_[0, np.flatnonzero(np.diff(group[order])) + 1]]
        return tuple(self._alternative(int(i), p99, mean, busy) for i in firsts)
