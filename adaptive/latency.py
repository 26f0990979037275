"""How long a batch takes: the latency model behind every prediction and simulation.

Two forms, as operators have them:
- `linear:BASE_MS,PER_ITEM_MS` — service time `base + per_item * b`, the shape BentoML
  fits online and a good first guess for GPU kernels;
- a table of measured points (batch size -> mean ms, optionally p99 ms) from a JSON file,
  such as `tidal profile` writes, interpolated between points.

Either may carry seeded jitter (lognormal, mean preserving; a table's p99 sets it) and a
memory limit: the largest batch that fits is
`(device memory - parameter memory) / per-sample activation memory`. A profile taken under
load also carries the time a request spends outside the batcher, per rate
(`adaptive.overhead`): the simulator's client account and the planner charge it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from adaptive.latency_fit import monotone_table
from adaptive.overhead import RequestOverhead, overhead_from_document
from tidal_base.errors import InvalidInput
from tidal_base.units import parse_size_bytes

_Z99 = 2.3263478740408408  # standard normal quantile at 0.99


@dataclass(frozen=True, slots=True)
class MemoryLimit:
    """Device memory budget of one worker, in bytes."""

    device_bytes: int
    parameter_bytes: int
    activation_bytes_per_sample: int

    def __post_init__(self) -> None:
        if self.activation_bytes_per_sample <= 0:
            raise InvalidInput(
                f"activation memory per sample must be > 0, got {self.activation_bytes_per_sample}"
            )
        if self.device_bytes <= self.parameter_bytes:
            raise InvalidInput(
                f"device memory ({self.device_bytes} B) must exceed parameter memory "
                f"({self.parameter_bytes} B)"
            )

    @property
    def max_batch_size(self) -> int:
        """The largest batch that fits: (device - parameter bytes) // activation bytes per sample,
        at least 1."""
        spare = self.device_bytes - self.parameter_bytes
        return max(1, spare // self.activation_bytes_per_sample)


class LatencyModel(Protocol):
    """Service time of a batch by its size; arrays in, arrays out, seconds."""

    @property
    def memory(self) -> MemoryLimit | None:
        """The device memory that bounds batch sizes; None when unbounded."""
        ...

    @property
    def overhead(self) -> RequestOverhead | None:
        """The time a request spends outside the batcher, by rate; None when not measured
        (then a client's latency is taken to be the worker's)."""
        ...

    def mean_s(self, batch_sizes: np.ndarray) -> np.ndarray:
        """Mean service time, in seconds, of a batch of each size in `batch_sizes` (an array
        of sizes >= 1): an array of the same shape, positive."""
        ...

    def jitter_sigma(self, batch_sizes: np.ndarray) -> np.ndarray:
        """The sigma of each size's lognormal jitter (0: none), an array of the same shape: a
        batch's time is its mean times a mean-one lognormal draw of that sigma."""
        ...

    def describe(self) -> str:
        """The model in a line for reports and records: its spec for a linear model, its source for
        a table."""
        ...


def max_feasible_batch(model: LatencyModel) -> int | None:
    """The largest batch the model's memory limit allows, or None when unlimited."""
    return model.memory.max_batch_size if model.memory else None


@dataclass(frozen=True, slots=True)
class LinearLatency:
    """`base_s + per_item_s * b`, with optional lognormal jitter of the given sigma."""

    base_s: float
    per_item_s: float
    sigma: float = 0.0
    memory: MemoryLimit | None = None
    overhead: RequestOverhead | None = None

    def __post_init__(self) -> None:
        for name in ("base_s", "per_item_s", "sigma"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InvalidInput(f"latency model {name} must be >= 0, got {value}")
        if self.base_s + self.per_item_s <= 0:
            raise InvalidInput("latency model must give a batch of 1 a positive service time")

    def mean_s(self, batch_sizes: np.ndarray) -> np.ndarray:
        """`base_s + per_item_s * b` for each size `b`, in seconds."""
        return self.base_s + self.per_item_s * np.asarray(batch_sizes, dtype=np.float64)

    def jitter_sigma(self, batch_sizes: np.ndarray) -> np.ndarray:
        """`sigma` for every size."""
        return np.full(np.shape(batch_sizes), self.sigma, dtype=np.float64)

    def describe(self) -> str:
        """The spec "linear:BASE_MS,PER_ITEM_MS", with ",jitter=S" when there is jitter (the memory
        limit is not in it)."""
        text = f"linear:{self.base_s * 1e3:g},{self.per_item_s * 1e3:g}"
        return text + (f",jitter={self.sigma:g}" if self.sigma else "")


@dataclass(frozen=True, slots=True)
class TableLatency:
    """Measured mean (and optional p99) service times, interpolated linearly.

    Beyond the largest measured size the last slope is extrapolated; a p99 makes each
    batch's jitter lognormal with that p99/mean ratio.
    """

    batch_sizes: tuple[int, ...]
    mean_times_s: tuple[float, ...]
    p99_times_s: tuple[float, ...] | None = None
    memory: MemoryLimit | None = None
    source: str = "table"
    overhead: RequestOverhead | None = None

    def __post_init__(self) -> None:
        sizes = self.batch_sizes
        if len(sizes) == 0 or len(sizes) != len(self.mean_times_s):
            raise InvalidInput(f"{self.source}: need one mean time per batch size")
        if any(b < 1 for b in sizes) or any(b2 <= b1 for b1, b2 in itertools.pairwise(sizes)):
            raise InvalidInput(f"{self.source}: batch sizes must be >= 1 and increasing")
        if any(not math.isfinite(t) or t <= 0 for t in self.mean_times_s):
            raise InvalidInput(f"{self.source}: mean times must be > 0")
        if self.p99_times_s is not None:
            if len(self.p99_times_s) != len(sizes):
                raise InvalidInput(f"{self.source}: need a p99 for every batch size or none")
            for b, mean, p99 in zip(sizes, self.mean_times_s, self.p99_times_s, strict=True):
                if p99 < mean:
                    raise InvalidInput(
                        f"{self.source}: p99 ({p99 * 1e3:g} ms) below mean "
                        f"({mean * 1e3:g} ms) at batch size {b}"
                    )

    def mean_s(self, batch_sizes: np.ndarray) -> np.ndarray:
        """The measured means, in seconds, interpolated linearly between sizes; the smallest size's
        mean below it, the last slope (never negative) extrapolated beyond the largest."""
        return _interpolate(self.batch_sizes, self.mean_times_s, batch_sizes)

    def jitter_sigma(self, batch_sizes: np.ndarray) -> np.ndarray:
        """Zero without p99s; else the sigma whose mean-one lognormal has each point's p99/mean
        ratio as its 99th percentile, interpolated between sizes and held beyond the ends."""
        if self.p99_times_s is None:
            return np.zeros(np.shape(batch_sizes), dtype=np.float64)
        ratios = np.array(self.p99_times_s) / np.array(self.mean_times_s)
        sigmas = [_lognormal_sigma_for_p99_ratio(r) for r in ratios]
        return np.interp(np.asarray(batch_sizes, dtype=np.float64), self.batch_sizes, sigmas)

    def describe(self) -> str:
        """`source`: the file, and which points the monotone fit moved."""
        return self.source


def _interpolate(xs: tuple[int, ...], ys: tuple[float, ...], at: np.ndarray) -> np.ndarray:
    at = np.asarray(at, dtype=np.float64)
    values = np.interp(at, xs, ys)
    if len(xs) >= 2:
        slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
        beyond = at > xs[-1]
        values[beyond] = ys[-1] + slope * (at[beyond] - xs[-1])
    return values


def p99_s(model: LatencyModel, batch_sizes: np.ndarray) -> np.ndarray:
    """The model's p99 service time: its mean times the 99th percentile of its mean-one
    lognormal jitter (the inverse of how a table's p99 sets that jitter)."""
    sigma = model.jitter_sigma(batch_sizes)
    return model.mean_s(batch_sizes) * np.exp(_Z99 * sigma - 0.5 * sigma * sigma)


def profile_document(model: LatencyModel, sizes: Iterable[int]) -> dict[str, Any]:
    """`model` at `sizes` as the profile JSON that `load_latency_table` reads back (what
    `simulate --latency-model` and the controller load)."""
    at = np.array(sorted(set(sizes)), dtype=np.float64)
    means, p99s = model.mean_s(at), p99_s(model, at)
    document: dict[str, Any] = {
        "source": model.describe(),
        "points": [
            {"batch_size": int(b), "mean_ms": round(m * 1e3, 4), "p99_ms": round(p * 1e3, 4)}
            for b, m, p in zip(at, means, p99s, strict=True)
        ],
    }
    if model.memory is not None:
        document["memory"] = {
            "device_bytes": model.memory.device_bytes,
            "parameter_bytes": model.memory.parameter_bytes,
            "activation_bytes_per_sample": model.memory.activation_bytes_per_sample,
        }
    if model.overhead is not None:
        document["request_overhead_ms"] = model.overhead.to_document()
    return document


def _lognormal_sigma_for_p99_ratio(ratio: float) -> float:
    """Sigma of a mean-one lognormal whose 99th percentile is `ratio`."""
    log_ratio = math.log(max(ratio, 1.0))
    discriminant = max(_Z99 * _Z99 - 2.0 * log_ratio, 0.0)
    return _Z99 - math.sqrt(discriminant)


def parse_latency_model(spec: str) -> LatencyModel:
    """A model from `linear:BASE_MS,PER_ITEM_MS[,jitter=S][,device_memory=..,...]` or a path."""
    if spec.startswith("linear:"):
        return _parse_linear(spec)
    path = Path(spec)
    if path.suffix.lower() == ".json" or path.exists():
        return load_latency_table(path)
    raise InvalidInput(
        f"latency model must be linear:BASE_MS,PER_ITEM_MS or a JSON file, got {spec!r}"
    )


def _parse_linear(spec: str) -> LinearLatency:
    parts = [p.strip() for p in spec.removeprefix("linear:").split(",") if p.strip()]
    positional = [p for p in parts if "=" not in p]
    options = dict(p.split("=", 1) for p in parts if "=" in p)
    if len(positional) != 2:
        raise InvalidInput(f"latency model {spec!r}: expected linear:BASE_MS,PER_ITEM_MS")
    try:
        base_ms, per_item_ms = (float(p) for p in positional)
        sigma = float(options.pop("jitter", 0.0))
    except ValueError:
        raise InvalidInput(f"latency model {spec!r}: values must be numbers") from None
    memory = _memory_from_options(options, spec)
    if options:
        raise InvalidInput(f"latency model {spec!r}: unknown option {sorted(options)[0]!r}")
    return LinearLatency(base_ms / 1e3, per_item_ms / 1e3, sigma, memory)


_MEMORY_KEYS = ("device_memory", "parameter_memory", "sample_memory")


def _memory_from_options(options: dict[str, str], where: str) -> MemoryLimit | None:
    present = [k for k in _MEMORY_KEYS if k in options]
    if not present:
        return None
    if len(present) != len(_MEMORY_KEYS):
        missing = [k for k in _MEMORY_KEYS if k not in options]
        raise InvalidInput(f"{where}: memory limit needs {', '.join(missing)} as well")
    device, parameters, sample = (parse_size_bytes(options.pop(k), field=k) for k in _MEMORY_KEYS)
    return MemoryLimit(device, parameters, sample)


def load_latency_table(path: Path) -> TableLatency:
    """Read a profile JSON: `{"points": [{"batch_size", "mean_ms", "p99_ms"?}], "memory"?}`."""
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise InvalidInput(f"{path}: latency model file not found") from None
    except (OSError, json.JSONDecodeError) as error:
        raise InvalidInput(f"{path}: not a readable JSON latency model ({error})") from None
    if not isinstance(document, dict) or not isinstance(document.get("points"), list):
        raise InvalidInput(f"{path}: expected an object with a 'points' list")
    return _table_from_document(document, str(path))


def _table_from_document(document: dict, source: str) -> TableLatency:
    points = sorted(document["points"], key=lambda p: p.get("batch_size", 0))
    try:
        sizes = tuple(int(p["batch_size"]) for p in points)
        means = tuple(float(p["mean_ms"]) / 1e3 for p in points)
        has_p99 = all("p99_ms" in p for p in points)
        p99s = tuple(float(p["p99_ms"]) / 1e3 for p in points) if has_p99 else None
        weights = tuple(float(p.get("batches", p.get("runs", 1))) for p in points)
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidInput(f"{source}: each point needs batch_size and mean_ms ({error})") from None
    memory = _memory_from_document(document, source)
    overhead = None
    if "request_overhead_ms" in document:
        overhead = overhead_from_document(document["request_overhead_ms"], source)
    TableLatency(sizes, means, p99s, memory, source)  # the measured points, validated as given
    fitted_means, fitted_p99s = monotone_table(sizes, means, p99s, weights)
    moved = _moved(sizes, (means, p99s), (fitted_means, fitted_p99s))
    if moved:
        source = f"{source} (monotone fit moved batch {', '.join(map(str, moved))})"
    return TableLatency(sizes, fitted_means, fitted_p99s, memory, source, overhead)


Column = tuple[float, ...] | None


def _moved(
    sizes: tuple[int, ...], measured: tuple[Column, Column], fitted: tuple[Column, Column]
) -> list[int]:
    """The sizes whose mean or p99 the monotone fit changed by more than rounding."""
    moved: set[int] = set()
    for before, after in zip(measured, fitted, strict=True):
        if before is None:
            continue
        for size, b, a in zip(sizes, before, after, strict=True):
            if abs(a - b) > 1e-6 * max(b, 1e-9):
                moved.add(size)
    return sorted(moved)


def _memory_from_document(document: dict, source: str) -> MemoryLimit | None:
    memory = document.get("memory")
    if memory is None:
        return None
    try:
        return MemoryLimit(
            int(memory["device_bytes"]),
            int(memory["parameter_bytes"]),
            int(memory["activation_bytes_per_sample"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidInput(
            f"{source}: memory needs device_bytes, parameter_bytes and "
            f"activation_bytes_per_sample ({error})"
        ) from None
