"""Load recorded traffic: request-level and count-level traces.

- Request-level: one row a request, with a timestamp column (`timestamp`, `time`,
  `arrival`, ... any case) holding float seconds or ISO-8601 date-times, such as the
  public Azure LLM inference trace's `TIMESTAMP` or BurstGPT's `Timestamp`; their token
  columns are kept beside the arrivals. Mooncake's JSON lines are request-level too.
- Count-level: `timestamp,count` (or `rate` in req/s, or `value` as in the Numenta
  traces) per fixed interval, or the Azure Functions 2019 per-minute invocation counts;
  arrivals inside each interval form a Poisson process.

The format is detected from the header (the field's formats: `simulations.trace_formats`).
Time is re-based so the first row is t = 0; the first row's wall-clock time is kept as
`origin` for labels and for aligning operator-declared events. Arrivals are produced in
chunks (`arrival_chunks`), so a simulation's memory does not grow with the trace's length.
"""

from __future__ import annotations

import csv
import enum
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd

from simulations.errors import TraceError
from simulations.kernel import spread_poisson_pieces
from simulations.trace_formats import (
    RequestTokens,
    is_functions_header,
    is_json_lines,
    read_functions,
    read_header,
    read_mooncake,
    read_tokens,
    token_columns,
)

TIMESTAMP_COLUMNS = ("timestamp", "time", "ts", "arrival", "arrival_s", "arrived_at", "date")
COUNT_COLUMNS = ("count", "requests", "value")
RATE_COLUMNS = ("rate", "rate_rps", "rps")


class TraceFormat(enum.StrEnum):
    AUTO = "auto"
    REQUESTS = "requests"
    COUNTS = "counts"


class Trace(Protocol):
    """Recorded traffic that can be replayed as arrival times (seconds from the start)."""

    name: str
    origin: datetime | None
    notes: tuple[str, ...]

    @property
    def duration_s(self) -> float: ...

    @property
    def expected_requests(self) -> float: ...

    def arrival_chunks(
        self, chunk_s: float, rng: np.random.Generator
    ) -> Iterator[tuple[float, np.ndarray]]:
        """(end, arrivals) per chunk: sorted arrivals; every later chunk's are >= end."""
        ...


@dataclass(frozen=True)
class RequestTrace:
    """Recorded arrival times, sorted, in seconds from the first request."""

    name: str
    arrivals_s: np.ndarray
    origin: datetime | None = None
    rate_scale: float = 1.0
    notes: tuple[str, ...] = ()
    tokens: RequestTokens | None = None  # per recorded request, in arrival order

    @property
    def duration_s(self) -> float:
        return float(self.arrivals_s[-1]) if self.arrivals_s.size else 0.0

    @property
    def expected_requests(self) -> float:
        return self.arrivals_s.size * self.rate_scale

    def arrival_chunks(
        self, chunk_s: float, rng: np.random.Generator
    ) -> Iterator[tuple[float, np.ndarray]]:
        bounds = np.arange(0.0, self.duration_s + chunk_s, chunk_s)
        cuts = np.searchsorted(self.arrivals_s, bounds, side="left")
        cuts[-1] = self.arrivals_s.size
        bounds[-1] = np.inf  # nothing follows the last chunk
        for end_s, start, stop in zip(bounds[1:], cuts[:-1], cuts[1:], strict=True):
            following = self.arrivals_s[stop] if stop < self.arrivals_s.size else -np.inf
            yield end_s, _rescale(self.arrivals_s[start:stop], following, self.rate_scale, rng)


def _rescale(
    times: np.ndarray, next_arrival: float, scale: float, rng: np.random.Generator
) -> np.ndarray:
    """Thin (scale < 1) or multiply (scale > 1) recorded arrivals.

    Extra copies land uniformly between a request and the next one, which keeps the
    trace's local rate shape without stacking copies on identical instants.
    """
    if scale == 1.0 or times.size == 0:
        return times
    if scale < 1.0:
        return times[rng.random(times.size) < scale]
    gaps = np.diff(times, append=max(next_arrival, times[-1]))
    whole, extra = divmod(scale, 1.0)
    parts = [times]
    for _ in range(int(whole) - 1):
        parts.append(times + rng.random(times.size) * gaps)
    if extra > 0:
        keep = rng.random(times.size) < extra
        parts.append(times[keep] + rng.random(int(keep.sum())) * gaps[keep])
    return np.sort(np.concatenate(parts))


@dataclass(frozen=True)
class CountTrace:
    """Counts of requests per fixed interval; interval k covers [k*step, (k+1)*step)."""

    name: str
    step_s: float
    counts: np.ndarray
    origin: datetime | None = None
    rate_scale: float = 1.0
    notes: tuple[str, ...] = field(default=())

    @property
    def duration_s(self) -> float:
        return self.counts.size * self.step_s

    @property
    def expected_requests(self) -> float:
        return float(self.counts.sum()) * self.rate_scale

    def arrival_chunks(
        self, chunk_s: float, rng: np.random.Generator
    ) -> Iterator[tuple[float, np.ndarray]]:
        rates = self.counts * (self.rate_scale / self.step_s)
        for chunk_start in np.arange(0.0, self.duration_s, chunk_s):
            chunk_end = min(chunk_start + chunk_s, self.duration_s)
            arrivals = _poisson_arrivals(rates, self.step_s, chunk_start, chunk_end, rng)
            yield (chunk_end if chunk_end < self.duration_s else np.inf), arrivals


def _poisson_arrivals(
    rates: np.ndarray, step_s: float, start: float, end: float, rng: np.random.Generator
) -> np.ndarray:
    """A Poisson process over [start, end) whose rate is constant within each interval."""
    first = int(start // step_s)
    last = min(rates.size, math.ceil(end / step_s))
    edges = np.clip(np.arange(first, last + 1) * step_s, start, end)
    lengths = np.diff(edges)
    counts = rng.poisson(rates[first:last] * lengths)
    exponentials = rng.standard_exponential(int(counts.sum()) + counts.size)
    return spread_poisson_pieces(edges[:-1], lengths, counts, exponentials)


def load_trace(
    path: str | Path,
    fmt: TraceFormat = TraceFormat.AUTO,
    *,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    function: str | None = None,
) -> RequestTrace | CountTrace:
    """Read a trace; raises TraceError naming the file (and line) on bad input.
    `function` picks one function's row of an Azure Functions trace (else their sum)."""
    path = Path(path)
    if time_scale <= 0 or rate_scale <= 0:
        raise TraceError(f"{path}: time scale and rate scale must be > 0")
    if not path.exists():
        raise TraceError(f"{path}: no such trace file")
    functions = is_functions_header(read_header(path))
    if function is not None and not functions:
        raise TraceError(
            f"{path}: a function was chosen, but this is not an Azure Functions trace "
            "(HashOwner,HashApp,HashFunction,Trigger,1..1440)"
        )
    if is_json_lines(path) and path.is_file():
        _refuse_forced(path, fmt, TraceFormat.REQUESTS, "Mooncake JSON lines (request-level)")
        seconds, tokens = read_mooncake(path)
        return _request_trace_from(path, seconds, None, tokens, time_scale, rate_scale)
    if functions:
        _refuse_forced(path, fmt, TraceFormat.COUNTS, "Azure Functions counts (count-level)")
        counts, which = read_functions(path, function)
        name = f"{path.name} ({which})"
        return CountTrace(name, 60.0 / time_scale, counts, None, rate_scale)
    table = _read_table(path)
    timestamp_col = _find_column(table, TIMESTAMP_COLUMNS)
    value_col = _find_column(table, COUNT_COLUMNS + RATE_COLUMNS)
    if fmt is TraceFormat.AUTO:
        fmt = TraceFormat.COUNTS if value_col is not None else TraceFormat.REQUESTS
    elif fmt is TraceFormat.REQUESTS and value_col is not None:
        # Replaying one request per row of a count trace would drop nearly all its load.
        raise TraceError(
            f"{path}: format 'requests' was forced, but the header has a {value_col!r} "
            "column: this is a count-level trace (one row per interval); drop the forced "
            "format or use 'counts'"
        )
    if timestamp_col is None:
        if len(table.columns) > 1:  # which column is time? say, rather than guess
            raise TraceError(
                f"{path}: no timestamp column in the header ({', '.join(map(str, table.columns))}"
                f"); name one {', '.join(TIMESTAMP_COLUMNS)}"
            )
        timestamp_col = table.columns[0]  # one column: the request timestamps
    if fmt is TraceFormat.COUNTS:
        if value_col is None:
            raise TraceError(
                f"{path}: a count-level trace needs a count or rate column, "
                f"header has {', '.join(table.columns)}"
            )
        return _count_trace(path, table, timestamp_col, value_col, time_scale, rate_scale)
    return _request_trace(path, table, timestamp_col, time_scale, rate_scale)


def _refuse_forced(path: Path, fmt: TraceFormat, reads_as: TraceFormat, what: str) -> None:
    if fmt not in (TraceFormat.AUTO, reads_as):
        raise TraceError(f"{path}: format {fmt.value!r} was forced, but this is {what}")


def _read_table(path: Path) -> pd.DataFrame:
    try:
        # index_col=False: a row with more fields than the header is an error (raised as
        # pandas' warning, then located below), never a silent shift into an index.
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            table = pd.read_csv(
                path,
                dtype=str,
                keep_default_na=False,
                skip_blank_lines=False,
                skipinitialspace=True,
                index_col=False,
            )
    except pd.errors.ParserWarning:
        raise TraceError(_ragged_row(path)) from None
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except IsADirectoryError:
        raise TraceError(f"{path}: is a directory, not a trace file") from None
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path}: empty trace (no header and no rows)") from None
    except pd.errors.ParserError as error:
        if "fields in line" in str(error):  # "Expected 2 fields in line 3, saw 3"
            raise TraceError(_ragged_row(path)) from None
        raise TraceError(f"{path}: not a readable CSV ({_first_line(error)})") from None
    except UnicodeDecodeError as error:
        raise TraceError(f"{path}: not a readable CSV ({_first_line(error)})") from None
    blank = (table == "").all(axis=1)
    table = table[~blank]
    if table.empty:
        raise TraceError(f"{path}: empty trace (a header but no rows)")
    return table


def _ragged_row(path: Path) -> str:
    """Where a row has more fields than the header (read again, on this error path only)."""
    with path.open(newline="", errors="replace") as handle:
        rows = csv.reader(handle, skipinitialspace=True)
        header = next(rows, [])
        for line, row in enumerate(rows, start=2):
            if len(row) > len(header):
                return (
                    f"{path}:{line}: {len(row)} fields, but the header has {len(header)} "
                    f"({','.join(header)})"
                )
    return f"{path}: a row has more fields than the header"


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _find_column(table: pd.DataFrame, names: tuple[str, ...]) -> str | None:
    lowered = {str(c).strip().lower(): c for c in table.columns}
    return next((lowered[n] for n in names if n in lowered), None)


def _line_of(table: pd.DataFrame, position: int) -> int:
    """1-based line in the file of the table's row at `position` (header is line 1)."""
    return int(table.index[position]) + 2


def _parse_timestamps(
    path: Path, table: pd.DataFrame, column: str
) -> tuple[np.ndarray, datetime | None]:
    """Seconds (float64) and the wall-clock origin when timestamps are date-times."""
    raw = table[column].str.strip()
    numeric = pd.to_numeric(raw, errors="coerce")
    if not np.isnan(numeric.iloc[0]):
        return _checked(path, table, column, numeric.to_numpy(dtype=np.float64)), None
    stamps = pd.to_datetime(raw, format="ISO8601", errors="coerce")
    if getattr(stamps.dt, "tz", None) is not None:
        stamps = stamps.dt.tz_convert("UTC").dt.tz_localize(None)
    bad = np.flatnonzero(stamps.isna().to_numpy())
    if bad.size:
        _raise_bad_row(path, table, column, int(bad[0]), "timestamp")
    nanos = stamps.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    origin_ns = int(nanos.min())
    seconds = (nanos - origin_ns).astype(np.float64) / 1e9
    return seconds, pd.Timestamp(origin_ns).to_pydatetime()


def _checked(path: Path, table: pd.DataFrame, column: str, values: np.ndarray) -> np.ndarray:
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        _raise_bad_row(path, table, column, int(bad[0]), "number")
    return values


def _raise_bad_row(path: Path, table: pd.DataFrame, column: str, row: int, what: str) -> None:
    content = ",".join(str(v) for v in table.iloc[row].tolist())
    raise TraceError(
        f"{path}:{_line_of(table, row)}: cannot parse {column!r} as a {what} in row {content!r}"
    )


def _request_trace(
    path: Path, table: pd.DataFrame, column: str, time_scale: float, rate_scale: float
) -> RequestTrace:
    seconds, origin = _parse_timestamps(path, table, column)
    columns = token_columns(table)
    tokens = None if columns is None else read_tokens(path, table, columns)
    return _request_trace_from(path, seconds, origin, tokens, time_scale, rate_scale)


def _request_trace_from(
    path: Path,
    seconds: np.ndarray,
    origin: datetime | None,
    tokens: RequestTokens | None,
    time_scale: float,
    rate_scale: float,
) -> RequestTrace:
    notes: list[str] = []
    if np.any(np.diff(seconds) < 0):
        notes.append(f"{path}: request timestamps were not sorted; sorted them")
        order = np.argsort(seconds, kind="stable")
        seconds = seconds[order]
        tokens = None if tokens is None else tokens.sorted_by(order)
    seconds = (seconds - seconds[0]) / time_scale
    if seconds[-1] <= 0:
        raise TraceError(
            f"{path}: {seconds.size} request(s), all at one instant: a replay needs "
            "arrivals spread over time (at least two timestamps)"
        )
    return RequestTrace(path.name, seconds, origin, rate_scale, tuple(notes), tokens)


def _count_trace(
    path: Path,
    table: pd.DataFrame,
    timestamp_col: str,
    value_col: str,
    time_scale: float,
    rate_scale: float,
) -> CountTrace:
    seconds, origin = _parse_timestamps(path, table, timestamp_col)
    values = pd.to_numeric(table[value_col].str.strip(), errors="coerce").to_numpy(np.float64)
    values = _checked(path, table, value_col, values)
    negative = np.flatnonzero(values < 0)
    if negative.size:
        row = int(negative[0])
        raise TraceError(
            f"{path}:{_line_of(table, row)}: negative {value_col!r} "
            f"({table[value_col].iloc[row]}) is not a request count"
        )
    order = np.argsort(seconds, kind="stable")
    notes = (
        []
        if np.all(order == np.arange(order.size))
        else [f"{path}: rows were not sorted; sorted them"]
    )
    _reject_duplicates(path, table, seconds, order)
    step_s, counts, gaps = _dense_counts(path, seconds[order], values[order])
    if value_col.strip().lower() in RATE_COLUMNS:
        counts = counts * step_s
    if gaps:
        notes.append(f"{path}: {gaps} missing intervals treated as zero requests")
    return CountTrace(path.name, step_s / time_scale, counts, origin, rate_scale, tuple(notes))


def _reject_duplicates(
    path: Path, table: pd.DataFrame, seconds: np.ndarray, order: np.ndarray
) -> None:
    ordered = seconds[order]
    repeated = np.flatnonzero(np.diff(ordered) == 0)
    if repeated.size:
        first, second = sorted((int(order[repeated[0]]), int(order[repeated[0] + 1])))
        raise TraceError(
            f"{path}:{_line_of(table, second)}: duplicate interval "
            f"(same timestamp as line {_line_of(table, first)})"
        )


def _dense_counts(
    path: Path, seconds: np.ndarray, counts: np.ndarray
) -> tuple[float, np.ndarray, int]:
    """Place counts on a fixed-step grid, zero-filling missing intervals."""
    if seconds.size == 1:
        return 1.0, counts.copy(), 0
    step_s = float(np.min(np.diff(seconds)))
    offsets = (seconds - seconds[0]) / step_s
    slots = np.rint(offsets).astype(np.int64)
    if np.any(np.abs(offsets - slots) > 1e-6):
        raise TraceError(f"{path}: count-level timestamps are not on a fixed step of {step_s:g} s")
    dense = np.zeros(int(slots[-1]) + 1)
    dense[slots] = counts
    return step_s, dense, dense.size - counts.size
