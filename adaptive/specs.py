"""The policy registry: policy specs (`static:max_batch=32,timeout=10ms`) to policies.

The grammar and its option readers are `tidal_base.specs`, shared with the forecaster
registry. A registry maps names to factories, so every shell parses and builds policies
alike; what each kind's spec may say is `adaptive.policy_kinds`, checked before a
factory runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from adaptive.aimd import AimdPolicy
from adaptive.autoscalers import HpaPolicy, ServeAutoscalerPolicy
from adaptive.capacity import JointPolicy
from adaptive.config import BatchConfig
from adaptive.dynamo_planner import DYNAMO_INTERVAL_S, DynamoPlannerPolicy
from adaptive.optimizer import ConfigOptimizer, PerformanceTable
from adaptive.policy import Policy, StaticPolicy
from adaptive.policy_kinds import POLICY_KINDS
from adaptive.predictive import PredictivePolicy
from adaptive.reactive import ReactivePolicy
from forecaster.interval_predictors import build_interval_predictor
from forecaster.known import KnownFuture
from forecaster.registry import build_forecaster
from forecaster.series import RateSeries
from tidal_base.errors import InvalidInput
from tidal_base.specs import Spec, built, option_duration, option_float, option_int, parse_spec

PolicySpec = Spec
"""A parsed policy spec (`kind` "policy"): the policy's name and its options as written."""


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
    replica_table: TableProvider | None = None  # the table for one replica (fleet planning)
    replica_startup_s: float = 0.0


PolicyFactory = Callable[[PolicySpec, PolicyContext], Policy]


def parse_policy_spec(text: str) -> PolicySpec:
    """A policy spec from its text; errors name the spec."""
    return parse_spec(text, kind="policy")


def _static(spec: PolicySpec, context: PolicyContext) -> Policy:
    max_batch = option_int(spec, "max_batch", 32)
    timeout_s = option_duration(spec, "timeout", 0.01)
    warm = option_int(spec, "warm", 0)
    return built(spec, lambda: StaticPolicy(BatchConfig(max_batch, timeout_s, warm)))


def _aimd(spec: PolicySpec, context: PolicyContext) -> Policy:
    return built(
        spec,
        lambda: AimdPolicy(
            timeout_s=option_duration(spec, "timeout", context.slo_s / 20),
            start=option_int(spec, "start", 8),
            step=option_int(spec, "step", 4),
            backoff=option_float(spec, "backoff", 0.9),
            fill=option_float(spec, "fill", 0.8),
            budget=option_float(spec, "budget", 0.5),
            max_batch=option_int(spec, "max_batch", 256),
        ),
    )


def _reactive(spec: PolicySpec, context: PolicyContext) -> Policy:
    return built(
        spec,
        lambda: ReactivePolicy(
            utilization=option_float(spec, "utilization", 0.75),
            max_batch=option_int(spec, "max_batch", 256),
        ),
    )


def _batch_config(spec: PolicySpec) -> BatchConfig:
    """The static batch config an autoscaler baseline runs (Serve's @serve.batch defaults:
    10 requests, 10 ms)."""
    return BatchConfig(option_int(spec, "max_batch", 10), option_duration(spec, "timeout", 0.01))


def _serve_autoscaler(spec: PolicySpec, context: PolicyContext) -> Policy:
    return built(
        spec,
        lambda: ServeAutoscalerPolicy(
            _batch_config(spec),
            target_ongoing_requests=option_float(spec, "target_ongoing", 2.0),
            look_back_s=option_duration(spec, "look_back", 30.0),
            upscale_delay_s=option_duration(spec, "upscale_delay", 30.0),
            downscale_delay_s=option_duration(spec, "downscale_delay", 600.0),
            scaling_factor=option_float(spec, "factor", 1.0),
        ),
    )


def _hpa(spec: PolicySpec, context: PolicyContext) -> Policy:
    return built(
        spec,
        lambda: HpaPolicy(
            _batch_config(spec),
            target=option_float(spec, "target", 0.6),
            period_s=option_duration(spec, "period", 15.0),
            tolerance=option_float(spec, "tolerance", 0.1),
            stabilization_s=option_duration(spec, "window", 300.0),
        ),
    )


def _dynamo_planner(spec: PolicySpec, context: PolicyContext) -> Policy:
    config = BatchConfig(option_int(spec, "max_batch", 32), option_duration(spec, "timeout", 0.01))
    interval_s = option_duration(spec, "interval", DYNAMO_INTERVAL_S)
    predictor_name = spec.options.get("predictor", "arima")  # Dynamo's default
    predictor = built(spec, lambda: build_interval_predictor(predictor_name))
    if context.replica_table is None:
        raise InvalidInput(
            f"policy {spec.text!r} plans replicas: give the fleet room to scale (--max-replicas)"
        )
    slo_s = context.slo_s
    # Dynamo sizes at its latency target itself: the profile's throughput at the SLO.
    optimizer = ConfigOptimizer(context.replica_table(slo_s), slo_s, margin=1.0)
    return built(
        spec,
        lambda: DynamoPlannerPolicy(config, optimizer, predictor, interval_s, spec_text=spec.text),
    )


def _optimizer(
    spec: PolicySpec, context: PolicyContext, table: TableProvider | None
) -> ConfigOptimizer:
    if table is None:
        raise InvalidInput(f"policy {spec.text!r} needs a latency model to plan with")
    slo_s = option_duration(spec, "slo", context.slo_s)
    margin = option_float(spec, "margin", 0.8)
    if not 0 < margin <= 1:  # ConfigOptimizer says so too, but only after the table
        raise InvalidInput(f"policy {spec.text!r}: margin must be in (0, 1], got {margin}")
    return built(spec, lambda: ConfigOptimizer(table(slo_s), slo_s, margin))


def _plans_replicas(spec: PolicySpec, context: PolicyContext) -> bool:
    mode = spec.options.get("replicas", "fixed")
    if mode not in ("fixed", "plan"):
        raise InvalidInput(f"policy {spec.text!r}: replicas must be fixed or plan, got {mode!r}")
    if mode == "plan" and context.replica_table is None:
        raise InvalidInput(
            f"policy {spec.text!r} plans replicas: give the fleet room to scale (--max-replicas)"
        )
    return mode == "plan"


def _planning(spec: PolicySpec, context: PolicyContext, forecaster, name: str) -> Policy:
    # Every option is read before the optimiser's table compiles (seconds of CPU): a bad
    # option fails at once.
    lead = spec.options.get("lead", "auto")
    lead_s = None if lead == "auto" else option_duration(spec, "lead", 0.0)
    step_s = option_duration(spec, "step", 10.0)
    history_s = option_duration(spec, "history", 6 * 3600.0)
    joint = _plans_replicas(spec, context)
    headroom = option_float(spec, "headroom", 0.8)
    scale_in_s = option_duration(spec, "scale_in", 600.0)
    risk = option_float(spec, "risk", 0.0)
    if not joint and {"headroom", "scale_in", "risk"} & set(spec.options):
        raise InvalidInput(f"policy {spec.text!r}: headroom, scale_in and risk need replicas=plan")
    table = context.replica_table if joint else context.table
    batching = PredictivePolicy(
        uses_events=name != "oracle",
        optimizer=_optimizer(spec, context, table),
        forecaster=forecaster,
        forecast_step_s=step_s,
        history_s=history_s,
        lead_s=lead_s,
        name=name,
        spec_text=spec.text,
    )
    if not joint:
        return batching
    return built(
        spec,
        lambda: JointPolicy(
            batching,
            startup_s=context.replica_startup_s,
            headroom=headroom,
            scale_in_after_s=scale_in_s,
            risk=risk,
            spec_text=spec.text,
        ),
    )


def _predictive(spec: PolicySpec, context: PolicyContext) -> Policy:
    forecaster = built(spec, lambda: build_forecaster(spec.options.get("forecaster", "holt")))
    return _planning(spec, context, forecaster, "predictive")


def _oracle(spec: PolicySpec, context: PolicyContext) -> Policy:
    if context.truth is None:
        raise InvalidInput(f"policy {spec.text!r} sees the recorded future: simulation only")
    return _planning(spec, context, KnownFuture(context.truth), "oracle")


POLICY_FACTORIES: dict[str, PolicyFactory] = {  # their options: adaptive.policy_kinds
    "static": _static,
    "aimd": _aimd,
    "reactive": _reactive,
    "predictive": _predictive,
    "oracle": _oracle,
    "serve-autoscaler": _serve_autoscaler,
    "hpa": _hpa,
    "dynamo-planner": _dynamo_planner,
}


def build_policy(text: str, context: PolicyContext) -> Policy:
    """Parse a spec and build its policy, with errors that name the spec and the option."""
    spec = parse_policy_spec(text)
    factory = POLICY_FACTORIES.get(spec.name)
    if factory is None:
        known = ", ".join(sorted(POLICY_FACTORIES))
        raise InvalidInput(f"unknown policy {spec.name!r} in {text!r} (known: {known})")
    POLICY_KINDS[spec.name].check(spec)  # unknown options and implausible values, by name
    return factory(spec, context)
