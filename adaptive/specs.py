"""Policy specs: one grammar for the CLI, the API and the simulator.

`NAME[:KEY=VALUE[,KEY=VALUE]...]`, for example `static:max_batch=32,timeout=10ms`.
A registry maps names to factories, so every shell parses and builds policies alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from adaptive.aimd import AimdPolicy
from adaptive.config import BatchConfig
from adaptive.errors import InvalidInput
from adaptive.optimizer import ConfigOptimizer, PerformanceTable
from adaptive.policy import Policy, StaticPolicy
from adaptive.predictive import PredictivePolicy
from adaptive.reactive import ReactivePolicy
from adaptive.units import parse_duration_s
from forecaster.known import KnownFuture
from forecaster.series import RateSeries


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A parsed spec: the policy's name and its options as written."""

    name: str
    options: Mapping[str, str]
    text: str


TableProvider = Callable[[float], PerformanceTable]
"""Builds the optimiser's table for an SLO (the shell knows the latency model and pool)."""


@dataclass(frozen=True)
class PolicyContext:
    """What a factory may need beyond the spec's own options.

    `table` compiles the optimiser's performance table (simulation-backed, supplied by
    the shell); `truth` is the recorded future, which only the simulator has.
    """

    slo_s: float
    workers: int
    table: TableProvider | None = None
    truth: RateSeries | None = None


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


def _int(spec: PolicySpec, key: str, default: int) -> int:
    text = spec.options.get(key)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise InvalidInput(
            f"policy {spec.text!r}: {key} must be an integer, got {text!r}"
        ) from None


def _float(spec: PolicySpec, key: str, default: float) -> float:
    text = spec.options.get(key)
    if text is None:
        return default
    try:
        return float(text)
    except ValueError:
        raise InvalidInput(f"policy {spec.text!r}: {key} must be a number, got {text!r}") from None


def _duration(spec: PolicySpec, key: str, default: float) -> float:
    text = spec.options.get(key)
    if text is None:
        return default
    try:
        return parse_duration_s(text, field=key)
    except InvalidInput as error:
        raise InvalidInput(f"policy {spec.text!r}: {error}") from None


def _built(spec: PolicySpec, build: Callable[[], Policy]) -> Policy:
    try:
        return build()
    except InvalidInput as error:
        if spec.text in str(error):
            raise
        raise InvalidInput(f"policy {spec.text!r}: {error}") from None


def _static(spec: PolicySpec, context: PolicyContext) -> Policy:
    _reject_unknown(spec, {"max_batch", "timeout", "warm"})
    max_batch = _int(spec, "max_batch", 32)
    timeout_s = _duration(spec, "timeout", 0.01)
    warm = _int(spec, "warm", 0)
    return _built(spec, lambda: StaticPolicy(BatchConfig(max_batch, timeout_s, warm)))


def _aimd(spec: PolicySpec, context: PolicyContext) -> Policy:
    _reject_unknown(spec, {"start", "step", "backoff", "timeout", "max_batch", "fill", "budget"})
    return _built(
        spec,
        lambda: AimdPolicy(
            timeout_s=_duration(spec, "timeout", context.slo_s / 20),
            start=_int(spec, "start", 8),
            step=_int(spec, "step", 4),
            backoff=_float(spec, "backoff", 0.9),
            fill=_float(spec, "fill", 0.8),
            budget=_float(spec, "budget", 0.5),
            max_batch=_int(spec, "max_batch", 256),
        ),
    )


def _reactive(spec: PolicySpec, context: PolicyContext) -> Policy:
    _reject_unknown(spec, {"utilization", "max_batch"})
    return _built(
        spec,
        lambda: ReactivePolicy(
            utilization=_float(spec, "utilization", 0.75), max_batch=_int(spec, "max_batch", 256)
        ),
    )


PLANNING_OPTIONS = {"lead", "slo", "margin", "step", "history"}


def _optimizer(spec: PolicySpec, context: PolicyContext) -> ConfigOptimizer:
    if context.table is None:
        raise InvalidInput(f"policy {spec.text!r} needs a latency model to plan with")
    slo_s = _duration(spec, "slo", context.slo_s)
    return _built(
        spec, lambda: ConfigOptimizer(context.table(slo_s), slo_s, _float(spec, "margin", 0.8))
    )


def _planning(spec: PolicySpec, context: PolicyContext, forecaster, name: str) -> Policy:
    lead = spec.options.get("lead", "auto")
    return PredictivePolicy(
        uses_events=name != "oracle",
        optimizer=_optimizer(spec, context),
        forecaster=forecaster,
        forecast_step_s=_duration(spec, "step", 10.0),
        history_s=_duration(spec, "history", 6 * 3600.0),
        lead_s=None if lead == "auto" else _duration(spec, "lead", 0.0),
        name=name,
        spec_text=spec.text,
    )


def _predictive(spec: PolicySpec, context: PolicyContext) -> Policy:
    from forecaster.registry import build_forecaster  # the registry imports this module

    _reject_unknown(spec, PLANNING_OPTIONS | {"forecaster"})
    forecaster = _built(spec, lambda: build_forecaster(spec.options.get("forecaster", "holt")))
    return _planning(spec, context, forecaster, "predictive")


def _oracle(spec: PolicySpec, context: PolicyContext) -> Policy:
    _reject_unknown(spec, PLANNING_OPTIONS)
    if context.truth is None:
        raise InvalidInput(f"policy {spec.text!r} sees the recorded future: simulation only")
    return _planning(spec, context, KnownFuture(context.truth), "oracle")


def _reject_unknown(spec: PolicySpec, known: set[str]) -> None:
    unknown = sorted(set(spec.options) - known)
    if unknown:
        raise InvalidInput(
            f"policy {spec.text!r}: unknown option {unknown[0]!r} "
            f"(known: {', '.join(sorted(known))})"
        )


POLICY_FACTORIES: dict[str, PolicyFactory] = {
    "static": _static,
    "aimd": _aimd,
    "reactive": _reactive,
    "predictive": _predictive,
    "oracle": _oracle,
}


def build_policy(text: str, context: PolicyContext) -> Policy:
    """Parse a spec and build its policy, with errors that name the spec and the option."""
    spec = parse_policy_spec(text)
    factory = POLICY_FACTORIES.get(spec.name)
    if factory is None:
        known = ", ".join(sorted(POLICY_FACTORIES))
        raise InvalidInput(f"unknown policy {spec.name!r} in {text!r} (known: {known})")
    return factory(spec, context)
