"""Policy specs: one grammar for the CLI, the API and the simulator.

`NAME[:KEY=VALUE[,KEY=VALUE]...]`, for example `static:max_batch=32,timeout=10ms`.
A registry maps names to factories, so every shell parses and builds policies alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adaptive.config import BatchConfig
from adaptive.errors import InvalidInput
from adaptive.policy import Policy, StaticPolicy
from adaptive.units import parse_duration_s


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A parsed spec: the policy's name and its options as written."""

    name: str
    options: Mapping[str, str]
    text: str


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a factory may need beyond the spec's own options."""

    slo_s: float
    workers: int


PolicyFactory = Callable[[PolicySpec, PolicyContext], Policy]


def parse_policy_spec(text: str) -> PolicySpec:
    name, _, rest = text.strip().partition(":")
    if not name:
        raise InvalidInput(f"policy spec must start with a policy name, got {text!r}")
    options: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or not key.strip() or not value.strip():
            raise InvalidInput(f"policy spec {text!r}: option {part!r} must be KEY=VALUE")
        if key.strip() in options:
            raise InvalidInput(f"policy spec {text!r}: option {key.strip()!r} given twice")
        options[key.strip()] = value.strip()
    return PolicySpec(name.strip(), options, text.strip())


def _static(spec: PolicySpec, context: PolicyContext) -> Policy:
    _reject_unknown(spec, {"max_batch", "timeout"})
    max_batch_text = spec.options.get("max_batch", "32")
    try:
        max_batch = int(max_batch_text)
    except ValueError:
        raise InvalidInput(
            f"policy {spec.text!r}: max_batch must be an integer, got {max_batch_text!r}"
        ) from None
    timeout_s = parse_duration_s(spec.options.get("timeout", "10ms"), field="timeout")
    try:
        return StaticPolicy(BatchConfig(max_batch, timeout_s))
    except InvalidInput as error:
        raise InvalidInput(f"policy {spec.text!r}: {error}") from None


def _reject_unknown(spec: PolicySpec, known: set[str]) -> None:
    unknown = sorted(set(spec.options) - known)
    if unknown:
        raise InvalidInput(
            f"policy {spec.text!r}: unknown option {unknown[0]!r} "
            f"(known: {', '.join(sorted(known))})"
        )


POLICY_FACTORIES: dict[str, PolicyFactory] = {"static": _static}


def build_policy(text: str, context: PolicyContext) -> Policy:
    """Parse a spec and build its policy, with errors that name the spec and the option."""
    spec = parse_policy_spec(text)
    factory = POLICY_FACTORIES.get(spec.name)
    if factory is None:
        known = ", ".join(sorted(POLICY_FACTORIES))
        raise InvalidInput(f"unknown policy {spec.name!r} in {text!r} (known: {known})")
    return factory(spec, context)
