"""The spec grammar: one `NAME[:KEY=VALUE[,KEY=VALUE]...]` form for policies and
forecasters, on the CLI, in the API and in the simulator.

For example `static:max_batch=32,timeout=10ms` or `holt-winters:seasonal=mul`. This
module parses specs and reads their options; the registries that turn a spec into a
policy (`adaptive.specs`) or a forecaster (`forecaster.registry`) live with what they
build.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from tidal_base.errors import InvalidInput
from tidal_base.units import is_bare_number, parse_duration_s

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Spec:
    """A parsed spec: what it names (`kind`, for messages), the name and its options as
    written, and the whole text."""

    name: str
    options: Mapping[str, str]
    text: str
    kind: str = "policy"


def parse_spec(text: str, *, kind: str = "policy") -> Spec:
    """`NAME[:KEY=VALUE,...]` into a `Spec`; errors name the `kind` and the text."""
    name, _, rest = text.strip().partition(":")
    if not name:
        raise InvalidInput(f"{kind} spec must start with a {kind} name, got {text!r}")
    options: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise InvalidInput(f"{kind} spec {text!r}: option {part!r} must be KEY=VALUE")
        if key.strip() in options:
            raise InvalidInput(f"{kind} spec {text!r}: option {key.strip()!r} given twice")
        options[key.strip()] = value.strip()
    return Spec(name.strip(), options, text.strip(), kind)


def option_int(spec: Spec, key: str, default: int) -> int:
    """The option as an integer, or `default` when it is absent."""
    return _option(spec, key, default, int, "an integer")


def option_float(spec: Spec, key: str, default: float) -> float:
    """The option as a float, or `default` when it is absent."""
    return _option(spec, key, default, float, "a number")


def _option(spec: Spec, key: str, default, convert, what: str):
    text = spec.options.get(key)
    if text is None:
        return default
    try:
        return convert(text)
    except ValueError:
        raise InvalidInput(
            f"{spec.kind} {spec.text!r}: {key} must be {what}, got {text!r}"
        ) from None


def option_duration(spec: Spec, key: str, default: float) -> float:
    """The option as a duration in seconds ("10ms", "1d"), or `default` when absent."""
    text = spec.options.get(key)
    if text is None:
        return default
    try:
        return parse_duration_s(text, field=key)
    except InvalidInput as error:
        raise InvalidInput(f"{spec.kind} {spec.text!r}: {error}") from None


def bare_durations(spec: Spec, keys: set[str]) -> list[tuple[str, str]]:
    """The (key, value) of each option in `keys` written as a bare number other than 0:
    a duration read as seconds (`timeout=10` is 10 s), which the shells warn about."""
    return [
        (key, value)
        for key, value in spec.options.items()
        if key in keys and is_bare_number(value) and float(value) != 0
    ]


def reject_unknown(spec: Spec, known: set[str]) -> None:
    """Raise naming the first option that is not in `known`, and listing those that are."""
    unknown = sorted(set(spec.options) - known)
    if unknown:
        raise InvalidInput(
            f"{spec.kind} {spec.text!r}: unknown option {unknown[0]!r} "
            f"(known: {', '.join(sorted(known))})"
        )


def built(spec: Spec, build: Callable[[], T]) -> T:
    """Run `build`, prefixing an `InvalidInput` it raises with the spec unless it names it."""
    try:
        return build()
    except InvalidInput as error:
        if spec.text in str(error):
            raise
        raise InvalidInput(f"{spec.kind} {spec.text!r}: {error}") from None
