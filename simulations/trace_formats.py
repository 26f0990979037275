"""The traces the field replays, read by their shape: the formats beyond plain CSV.

- Mooncake (JSON lines): `{"timestamp": ms, "input_length": .., "output_length": ..,
  "hash_ids": [..]}` one request a line (the Mooncake/Kimi traces, and what Dynamo's
  planner warms its predictors on).
- Azure Functions 2019 invocation counts: one row per function, `HashOwner,HashApp,
  HashFunction,Trigger,1..1440`: per-minute counts of one day. One function's row
  (`function=HASH`), or the sum of every row.
- Token columns of request-level CSV traces, kept beside the arrivals: the Azure LLM
  traces' `ContextTokens,GeneratedTokens` (2023, 2024) and BurstGPT's `Request tokens,
  Response tokens` (its `Timestamp` is seconds from the start, read as request-level).

Errors are `TraceError`s naming the file and, where there is one, the line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulations.errors import TraceError

FUNCTION_ID_COLUMNS = ("HashOwner", "HashApp", "HashFunction", "Trigger")
MINUTES = 1440
MOONCAKE_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})
TOKEN_COLUMNS = (
    ("contexttokens", "generatedtokens"),  # Azure LLM inference traces
    ("request tokens", "response tokens"),  # BurstGPT
)


@dataclass(frozen=True)
class RequestTokens:
    """Tokens per request, in the trace's request order: prompt (input) and output."""

    input: np.ndarray
    output: np.ndarray

    def sorted_by(self, order: np.ndarray) -> RequestTokens:
        return RequestTokens(self.input[order], self.output[order])

    def describe(self) -> str:
        """ "mean 1,020 input and 240 output tokens"."""
        return (
            f"mean {float(self.input.mean()):,.0f} input and "
            f"{float(self.output.mean()):,.0f} output tokens"
        )


def is_json_lines(path: Path) -> bool:
    """A `.jsonl`/`.ndjson` file, or one whose first non-blank character opens an object."""
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return True
    try:
        with path.open("rb") as handle:
            head = handle.read(256).lstrip()
    except OSError:
        return False  # the CSV reader says why, in its words
    return head.startswith(b"{")


def is_functions_header(header: list[str]) -> bool:
    """The Azure Functions 2019 invocation-count header."""
    return tuple(header[:4]) == FUNCTION_ID_COLUMNS and len(header) == 4 + MINUTES


def read_header(path: Path) -> list[str]:
    """The first line's fields (empty when the file cannot be read as text)."""
    try:
        with path.open(newline="", errors="replace") as handle:
            return [field.strip() for field in handle.readline().rstrip("\r\n").split(",")]
    except OSError:
        return []


def read_mooncake(path: Path) -> tuple[np.ndarray, RequestTokens]:
    """Arrival times in seconds (as written, unsorted) and tokens from a Mooncake trace."""
    times: list[float] = []
    inputs: list[float] = []
    outputs: list[float] = []
    with path.open(encoding="utf-8", errors="replace") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            record = _mooncake_record(path, line_number, line)
            times.append(record["timestamp"] / 1000.0)
            inputs.append(record.get("input_length", 0))
            outputs.append(record.get("output_length", 0))
    if not times:
        raise TraceError(f"{path}: empty trace (no requests)")
    tokens = RequestTokens(np.asarray(inputs, np.float64), np.asarray(outputs, np.float64))
    return np.asarray(times, np.float64), tokens


def _mooncake_record(path: Path, line_number: int, line: str) -> dict:
    where = f"{path}:{line_number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise TraceError(f"{where}: not a JSON object ({error.msg})") from None
    if not isinstance(record, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(record).__name__}")
    unknown = sorted(set(record) - MOONCAKE_KEYS)
    if unknown:
        raise TraceError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(MOONCAKE_KEYS))})"
        )
    if "timestamp" not in record:
        raise TraceError(f"{where}: no 'timestamp' (milliseconds)")
    for key in ("timestamp", "input_length", "output_length"):
        value = record.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise TraceError(f"{where}: {key!r} must be a number >= 0, got {value!r}")
    return record


def read_functions(path: Path, function: str | None) -> tuple[np.ndarray, str]:
    """Per-minute counts of one function (`function`, its HashFunction) or of every row
    summed, and a label saying which."""
    try:
        table = pd.read_csv(path, dtype={c: str for c in FUNCTION_ID_COLUMNS})
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: not a readable CSV ({str(error).strip()[:200]})") from None
    minutes = table.columns[4:]
    counts = table[minutes].apply(pd.to_numeric, errors="coerce")
    bad = np.argwhere(~np.isfinite(counts.to_numpy(np.float64)) | (counts.to_numpy() < 0))
    if bad.size:
        row, column = (int(i) for i in bad[0])
        raise TraceError(
            f"{path}:{row + 2}: minute {minutes[column]!r} must be a count >= 0, "
            f"got {table.iloc[row, 4 + column]!r}"
        )
    if function is None:
        return counts.to_numpy(np.float64).sum(axis=0), f"all {len(table):,} functions"
    rows = np.flatnonzero(table["HashFunction"].to_numpy() == function)
    if rows.size == 0:
        raise TraceError(
            f"{path}: no function {function!r} among its {len(table):,} (column HashFunction)"
        )
    # A function can appear once per trigger: its invocations are the rows' sum.
    return counts.to_numpy(np.float64)[rows].sum(axis=0), f"function {function}"


def token_columns(table: pd.DataFrame) -> tuple[str, str] | None:
    """The (input, output) token columns of a request-level table, when it has them."""
    lowered = {str(c).strip().lower(): c for c in table.columns}
    for prompt, output in TOKEN_COLUMNS:
        if prompt in lowered and output in lowered:
            return lowered[prompt], lowered[output]
    return None


def read_tokens(path: Path, table: pd.DataFrame, columns: tuple[str, str]) -> RequestTokens:
    """The token columns as numbers; a row that does not parse is named by its line."""
    arrays = []
    for column in columns:
        values = pd.to_numeric(table[column].str.strip(), errors="coerce").to_numpy(np.float64)
        bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
        if bad.size:
            line = int(table.index[bad[0]]) + 2
            raise TraceError(
                f"{path}:{line}: {column!r} must be a token count >= 0, "
                f"got {table[column].iloc[bad[0]]!r}"
            )
        arrays.append(values)
    return RequestTokens(*arrays)
