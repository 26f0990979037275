"""What a request spends outside the batcher, as a function of the load: the overhead.

A worker's own latency account starts when a request joins the batcher's queue and ends
when its batch completes. A client waits longer: the socket's and the event loop's
queue, reading and decoding the body, the answer's way back. That time grows with the
load, since the HTTP layer queues too, and at a tight SLO it is what decides whether a
batch timeout fits (`benchmarks/vs_ray_serve.py` measured it eating the SLO at heavy
load).

`tidal profile --under-load` measures it per rate (`request_overhead_ms` in the
profile: quantiles of client latency minus queue wait and execution, per worker at each
offered rate). `RequestOverhead` holds those distributions and answers, for a worker's
arrival rate, the inverse CDF on an even grid of probabilities: what the simulator draws
from to add to each request's worker latency (its client account), and what the
planner's table charges against the SLO. Between measured rates the quantiles are
interpolated linearly in rate; outside them the nearest rate's are held, since an
extrapolated queue is a guess the profile did not make.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tidal_base.errors import InvalidInput

GRID_POINTS = 257
"""Inverse-CDF points per rate, at probabilities 0, 1/256, ..., 1."""


@dataclass(frozen=True, slots=True)
class RequestOverhead:
    """Per worker arrival rate, the distribution of the time outside the batcher (s).

    `quantiles_s[i][j]` is the overhead at `levels[j]` for a worker offered
    `rates_rps[i]`; levels run from 0 to 1 and quantiles never fall along them."""

    rates_rps: tuple[float, ...]
    levels: tuple[float, ...]
    quantiles_s: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not self.rates_rps or len(self.quantiles_s) != len(self.rates_rps):
            raise InvalidInput("request overhead: need one quantile list per rate")
        if any(r2 <= r1 for r1, r2 in itertools.pairwise(self.rates_rps)):
            raise InvalidInput("request overhead: rates must be increasing")
        levels = self.levels
        if len(levels) < 2 or levels[0] != 0.0 or levels[-1] != 1.0:
            raise InvalidInput("request overhead: levels must run from 0 to 1")
        if any(b <= a for a, b in itertools.pairwise(levels)):
            raise InvalidInput("request overhead: levels must be increasing")
        for rate, quantiles in zip(self.rates_rps, self.quantiles_s, strict=True):
            if len(quantiles) != len(levels):
                raise InvalidInput(f"request overhead at {rate:g} req/s: need a quantile per level")
            if any(not math.isfinite(q) or q < 0 for q in quantiles) or any(
                b < a for a, b in itertools.pairwise(quantiles)
            ):
                raise InvalidInput(
                    f"request overhead at {rate:g} req/s: quantiles must be finite, >= 0 "
                    "and never fall"
                )

    def inverse_cdf_s(self, worker_rate_rps: float) -> np.ndarray:
        """The overhead at probabilities 0, 1/(GRID_POINTS-1), ..., 1 for a worker offered
        `worker_rate_rps`: interpolated between measured rates, held beyond them."""
        return self._at(worker_rate_rps, np.linspace(0.0, 1.0, GRID_POINTS))

    def quantile_s(self, worker_rate_rps: float, level: float) -> float:
        """The overhead at probability `level` for a worker offered `worker_rate_rps`."""
        return float(self._at(worker_rate_rps, np.array([level]))[0])

    def _at(self, worker_rate_rps: float, probabilities: np.ndarray) -> np.ndarray:
        rates = self.rates_rps
        rate = min(max(worker_rate_rps, rates[0]), rates[-1])
        hi = min(int(np.searchsorted(rates, rate)), len(rates) - 1)
        upper = np.interp(probabilities, self.levels, self.quantiles_s[hi])
        if hi == 0 or rate >= rates[hi]:
            return upper
        lower = np.interp(probabilities, self.levels, self.quantiles_s[hi - 1])
        w = (rate - rates[hi - 1]) / (rates[hi] - rates[hi - 1])
        return (1 - w) * lower + w * upper

    def describe(self) -> str:
        """One line: the p99 at the lowest and highest measured rate."""
        low, high = self.rates_rps[0], self.rates_rps[-1]
        return (
            f"overhead outside the batcher: p99 {self.quantile_s(low, 0.99) * 1e3:.1f} ms at "
            f"{low:g} req/s to {self.quantile_s(high, 0.99) * 1e3:.1f} ms at {high:g} req/s "
            "per worker"
        )

    def to_document(self) -> list[dict[str, Any]]:
        """As a profile's `request_overhead_ms` (what `overhead_from_document` reads)."""
        return [
            {
                "rate_rps": rate,
                "levels": list(self.levels),
                "quantiles": [round(q * 1e3, 4) for q in quantiles],
            }
            for rate, quantiles in zip(self.rates_rps, self.quantiles_s, strict=True)
        ]


def overhead_from_document(entries: Any, source: str) -> RequestOverhead:
    """A profile's `request_overhead_ms`: a list of `{"rate_rps", "levels",
    "quantiles"}` (ms), as `tidal profile --under-load` writes it."""
    where = f"{source}: request_overhead_ms"
    if not isinstance(entries, list) or not entries:
        raise InvalidInput(f"{where} must be a non-empty list of per-rate entries")
    rows: list[tuple[float, Sequence[float], Sequence[float]]] = []
    for index, entry in enumerate(entries):
        try:
            rate = float(entry["rate_rps"])
            levels = [float(v) for v in entry["levels"]]
            quantiles = [float(v) / 1e3 for v in entry["quantiles"]]
        except (KeyError, TypeError, ValueError) as error:
            raise InvalidInput(
                f"{where}[{index}] needs rate_rps, levels and quantiles ({error})"
            ) from None
        rows.append((rate, levels, quantiles))
    rows.sort(key=lambda row: row[0])
    levels = rows[0][1]
    if any(list(row[1]) != list(levels) for row in rows):
        raise InvalidInput(f"{where}: every rate must use the same levels")
    try:
        return RequestOverhead(
            tuple(r for r, _, _ in rows), tuple(levels), tuple(tuple(q) for _, _, q in rows)
        )
    except InvalidInput as error:
        raise InvalidInput(f"{source}: {error}") from None
