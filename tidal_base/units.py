"""Parse and format durations, rates and byte sizes at the edges.

Inside Tidal every duration is float seconds and every size is bytes (house rule: units
in names, SI base units inside). People write "10ms", "1.5s", "20m" or "8GiB"; these
helpers convert at the command line, spec and file boundaries.
"""

import math
import re

from tidal_base.errors import InvalidInput

_DURATION_UNITS_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_SIZE_UNITS_B = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Zµ]*)\s*$")


def parse_duration_s(text: str | float | int, *, field: str = "duration") -> float:
    """Seconds from "250us", "10ms", "1.5s", "20m", "2h"; a bare number means seconds."""
    if isinstance(text, int | float):
        return _non_negative(float(text), field, text)
    written = str(text).strip()
    match = _NUMBER_UNIT.match(written.removeprefix("-"))  # "-5ms": a duration, below 0
    unit = match.group(2).lower() if match else None
    if match is None or unit not in {**_DURATION_UNITS_S, "": 1.0}:
        raise InvalidInput(f"{field} must be a duration such as 10ms, 1.5s or 20m, got {text!r}")
    value = float(match.group(1)) * _DURATION_UNITS_S.get(unit, 1.0)
    if written.startswith("-") and value > 0:
        raise InvalidInput(f"{field} must be a finite value >= 0, got {text!r}")
    return _non_negative(value, field, text)


def is_bare_number(text: str) -> bool:
    """Whether `text` is a number with no unit ("10", "0.5"): a duration read as seconds."""
    match = _NUMBER_UNIT.match(str(text))
    return match is not None and not match.group(2)


def parse_size_bytes(text: str | int, *, field: str = "size") -> int:
    """Bytes from "8GiB", "512MB", "1024"; a bare number means bytes."""
    if isinstance(text, int):
        return int(_non_negative(float(text), field, text))
    match = _NUMBER_UNIT.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS_B:
        raise InvalidInput(f"{field} must be a size such as 8GiB or 512MB, got {text!r}")
    return int(_non_negative(float(match.group(1)) * _SIZE_UNITS_B[unit], field, text))


def format_duration(seconds: float) -> str:
    """A short human form: 0.0004 -> "400us", 0.01 -> "10ms", 90 -> "90s"."""
    if seconds == 0:
        return "0ms"
    if seconds < 1e-3:
        return f"{seconds * 1e6:g}us"
    if seconds < 1:
        return f"{seconds * 1e3:g}ms"
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def _non_negative(value: float, field: str, original: object) -> float:
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{field} must be a finite value >= 0, got {original!r}")
    return value
