"""The operator API's bodies, in and out: what the OpenAPI at /docs shows, and what the
handlers build and return, so the two cannot drift.

Requests are validated by FastAPI before a handler runs. Responses are instances of the
models below: each route returns its model (FastAPI takes the route's response model
from the handler's return type) or, where it picks its own status (`/readyz`), builds
the model and serializes it. A response model forbids fields it does not declare
(`ResponseModel`), so a handler that fills a field the model lacks, leaves out one it
requires, or gives one the wrong type fails with a 500 (tests/test_control_api_models.py
and the schemathesis run in tests/test_api_schema.py catch it), never answering a body
its schema does not describe.

A field with a default is one a body may leave out: the routes that return such a model
serialize only the fields the handler set (`response_model_exclude_unset`), so "absent"
and "null" stay distinct as they always were. Two models carry documents whose producer
is not this API and allow fields beyond those declared: a member's heartbeat
(`WorkerRow`) and `simulate`'s per-policy summary (`PolicyOutcome`). The decision log's
records are objects as stored on the bus (docs/control-plane.md describes them).

Adding a field to a pool's status: declare it on `PoolSummary` here and fill it in
`server.control.pool_views.pool_summary`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# -- requests --------------------------------------------------------------------------


class RequestModel(BaseModel):
    """A body this API takes: a key it does not know is a 422 naming it, never ignored
    (a misspelt `promte: true` must not run the gate and quietly not promote)."""

    model_config = ConfigDict(extra="forbid")


class PolicyRequest(RequestModel):
    policy: str = Field(description="a policy spec, e.g. predictive:forecaster=holt-winters")


class ShadowRequest(RequestModel):
    policy: str | None = Field(
        description="a policy spec to run beside the pool's policy, recorded in the decisions "
        "and never applied; null lifts the shadow"
    )


class OverrideRequest(RequestModel):
    # Strict: pydantic's lax mode would take `true` as 1 and "8" as 8.
    model_config = ConfigDict(strict=True, extra="forbid")

    max_batch: int = Field(ge=1, le=65536)
    timeout_ms: float = Field(ge=0, le=60_000, allow_inf_nan=False)
    warm_max_batch: int = Field(default=0, ge=0, le=65536)
    duration: str | float = Field(description='how long the pin holds: "15m", "2h" or seconds')
    reason: str = Field(default="", max_length=500)
    replicas: int | None = Field(
        default=None, ge=1, le=100_000, description="pin the replica count too (--max-replicas)"
    )


class EventsRequest(RequestModel):
    events: list[dict[str, Any]] = Field(
        description="events as in an events file: name, start, end, multiplier | rate_rps, "
        "ramp_up, ramp_down (times ISO-8601 or Unix seconds)"
    )


class SimulateRequest(RequestModel):
    candidate: str = Field(description="the candidate policy spec")
    hours: float = Field(default=1.0, gt=0, le=24 * 8, description="recorded traffic to replay")
    promote: bool = Field(default=False, description="switch to the candidate if no worse")
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="the replay's random seed")


# -- responses -------------------------------------------------------------------------


class ResponseModel(BaseModel):
    """A body this API answers: only the fields it declares (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")


class Health(ResponseModel):
    status: Literal["ok"]


class PoolHealth(ResponseModel):
    ready: bool
    status: str = Field(description="ticking, starting, failed to start: ..., tick failing: ...")
    last_error: str | None = Field(default=None, description="absent until the loop runs")
    errors: dict[str, int] = Field(description="failed ticks by stage")
    malformed_stats: int | None = Field(default=None, description="absent until the loop runs")
    settings_error: str | None = Field(description="why stored settings were ignored")


class Readiness(ResponseModel):
    status: Literal["ready", "not ready"]
    error: str | None = Field(description="which pools are not ready, and why")
    pools: dict[str, PoolHealth]


class BatchConfigBody(ResponseModel):
    """A batching config, its timeout in milliseconds."""

    # As `adaptive.decisions.config_dict` writes it (the decision log's records too).

    max_batch: int
    timeout_ms: float
    warm_max_batch: int


class PinnedOverride(BatchConfigBody):
    """An operator's pinned config."""

    # As `server.control.plane.PinnedConfig.to_dict` writes it (stored on the bus too).

    until: float = Field(description="Unix seconds: the pin lifts itself then")
    reason: str
    replicas: int | None = Field(description="the pinned replica count, if one is")


class ThisController(ResponseModel):
    name: str
    leading: bool


class BackgroundJobs(ResponseModel):
    """The controller's work off the control step: forecast refits (the policy's and the
    shadow's) and rebuilds of the planner's table, since this controller started."""

    refits: int
    replans: int
    failed: dict[str, int] = Field(
        description="failed jobs by kind; the controller kept what it had and retries after "
        "a backoff"
    )
    last_failure: str | None
    dropped: int = Field(
        description="jobs that finished after the controller or shadow that asked for them "
        "was replaced (a policy switch, a promotion): never installed"
    )


class PoolSummary(ResponseModel):
    """A pool's state; `last_decision` is a record of the decision log
    (docs/control-plane.md)."""

    # A new field: declare it here (with a description), then fill it in
    # `server.control.pool_views.pool_summary`; the tests fail until both agree.

    pool: str
    config: BatchConfigBody
    version: int
    policy: str
    shadow: str | None = Field(description="the shadow policy's spec, if one runs")
    slo_ms: float
    mode: str = Field(description="the policy's mode, or override while one is pinned")
    mode_reason: str | None
    override: PinnedOverride | None
    events: list[str] = Field(description="the declared events' names")
    leader: str | None = Field(description="the controller holding the pool's lease")
    this_controller: ThisController
    ready: bool
    workers_alive: int
    workers_ready: int = Field(description="alive and ready: warm, dispatching")
    workers_not_ready: dict[str, str] = Field(description="alive but not ready, and why")
    desired_replicas: int | None = Field(
        description="a fleet that scales (--max-replicas): how many replicas the pool should have"
    )
    slo_feasible: bool = Field(
        description="false while the policy predicts no config meets the SLO (it holds its best)"
    )
    slo_infeasible_for_s: float | None
    engines: dict[str, int] = Field(description="members alive by engine kind")
    refusing: dict[str, dict[str, Any]] = Field(
        description="members whose engine refused a newer config (they serve the old one), "
        "by name: version, config, reason"
    )
    unplanned_reloads: dict[str, float] = Field(
        description="engines reloading for longer than the plan's --reload: kind -> seconds"
    )
    ticks: int
    last_tick_ms: float
    last_error: str | None
    jobs: BackgroundJobs
    health: PoolHealth
    config_changes: int
    fallback_s: float
    last_decision: dict[str, Any] | None


class PoolList(ResponseModel):
    pools: list[PoolSummary] = Field(description="the pools whose control loop runs")


class DecisionLog(ResponseModel):
    pool: str
    decisions: list[dict[str, Any]] = Field(
        description="decision records as stored, oldest first (docs/control-plane.md)"
    )


class ForecastPoint(ResponseModel):
    time: float
    mean_rps: float | None
    lower_rps: float | None
    upper_rps: float | None


class ForecastBody(ResponseModel):
    model: str
    fallback: str | None
    level: float
    band: str
    events: list[str]
    points: list[ForecastPoint]


class RatePoint(ResponseModel):
    time: float
    rps: float | None


class PoolForecast(ResponseModel):
    """The forecast the policy plans with; a policy that does not forecast answers only
    `pool`, `forecast` (null) and `note`."""

    pool: str
    step_s: float | None = None
    forecast: ForecastBody | None
    note: str | None = None
    actual: list[RatePoint] | None = Field(default=None, description="the last 60 steps")
    steps_scored: int | None = None
    steps_outside_band: int | None = None


class TimelineColumns(ResponseModel):
    """One value per bucket in each column."""

    # `server.control.timeline.COLUMNS`, as `Timeline.window` fills them.

    time: list[float]
    rate_rps: list[float]
    p99_ms: list[float | None]
    max_batch: list[int]
    serving_max_batch: list[int | None]
    warm_max_batch: list[int]
    timeout_ms: list[float]
    replicas: list[int | None]


class PoolTimeline(ResponseModel):
    pool: str
    seconds: float
    rows: int = Field(description="ticks in the window, before bucketing")
    columns: TimelineColumns


class LatencyDrift(ResponseModel):
    relative: float
    batch_size: int
    measure: str = Field(description="mean or p99")


class LearningBody(ResponseModel):
    half_life_s: float
    prior_batches: float
    min_batches: float
    drift_threshold: float | None = Field(description="null: learn and show only, never rebuild")
    min_interval_s: float


class SizeEstimate(ResponseModel):
    batch_size: int
    mean_ms: float
    p99_ms: float
    batches: float
    source: str = Field(description='prior, measured, blended or "prior x1.31" (scaled)')


class LatencyModelSummary(ResponseModel):
    """`format=summary`: the latency model learned from serving, per padded batch size."""

    pool: str
    prior: str
    model: str
    planned_with: str | None
    measured_batches: float
    drift: LatencyDrift | None
    rebuilds: int
    last_rebuild: str | None
    learning: LearningBody
    sizes: list[SizeEstimate]


class ProfilePoint(ResponseModel):
    batch_size: int
    mean_ms: float
    p99_ms: float


class ProfileMemory(ResponseModel):
    device_bytes: int
    parameter_bytes: int
    activation_bytes_per_sample: float


class LatencyProfile(ResponseModel):
    """`format=profile`: the profile JSON `simulate --latency-model` loads."""

    # As `adaptive.latency.profile_document` writes it.

    source: str
    points: list[ProfilePoint]
    memory: ProfileMemory | None = Field(default=None, description="absent when not measured")


class WindowStats(ResponseModel):
    """A member's last stats window."""

    window_s: float
    arrivals: int
    completed: int
    shed: int
    queue_depth: int
    busy_s: float
    batch_sizes: dict[int, int] = Field(description="batches by size")
    max_batch_size: int
    warmed_buckets: list[int] | None = Field(description="null: the engine has no warm-up")
    config_version: int
    ingress_p50_ms: float | None = Field(description="the HTTP layer's queue, socket to batcher")
    ingress_p99_ms: float | None


class WorkerRow(ResponseModel):
    """A member alive, with the fields of its own heartbeat (they vary by engine: at least
    queue_depth, serving_max_batch, warmed_buckets; docs/engines.md)."""

    model_config = ConfigDict(extra="allow")

    name: str
    heartbeat_age_s: float
    ready: bool = Field(description="true when its heartbeat does not say")
    last_stats: WindowStats | None


class WorkerList(ResponseModel):
    pool: str
    workers: list[WorkerRow]


class EventBody(ResponseModel):
    """A declared event as an events file gives it (times in Unix seconds); it has a
    multiplier or a rate, never both."""

    name: str
    start: float
    end: float
    multiplier: float | None = None
    rate_rps: float | None = None
    ramp_up: float
    ramp_down: float


class PoolEvents(ResponseModel):
    pool: str
    events: list[EventBody]


class OverrideSet(ResponseModel):
    pool: str
    override: PinnedOverride


class OverrideLifted(ResponseModel):
    pool: str
    lifted: bool = Field(description="false when no override was pinned")


class GateTraffic(ResponseModel):
    from_: int = Field(alias="from", description="Unix second the replay starts at")
    seconds: int
    requests: int


class LatencyQuantiles(ResponseModel):
    p50: float | None
    p90: float | None
    p99: float | None
    p999: float | None
    max: float | None
    mean: float | None


class ClampedBatch(ResponseModel):
    requested: int
    applied: int


class PolicyOutcome(ResponseModel):
    """One policy's entry of `simulate`'s summary JSON (docs/simulate.md)."""

    model_config = ConfigDict(extra="allow")

    policy: str
    completed: int
    shed: int
    throughput_rps: float
    latency_ms: LatencyQuantiles
    slo_attainment: float
    slo_attainment_worst_10min: float
    mean_batch_size: float
    batch_fill_ratio: float
    utilization: float
    busy_seconds: float
    busy_seconds_per_1k: float
    wall_s: float
    sim_requests_per_s: int
    config_changes: int
    replica_seconds: float
    max_replicas: int
    replica_changes: int
    fallback_s: float
    clamped_max_batch: ClampedBatch | None
    client_latency_ms: LatencyQuantiles | None = Field(
        default=None,
        description="what clients see: the worker's latency plus the time outside the "
        "batcher measured under load; only when the latency model carries it",
    )
    client_slo_attainment: float | None = None


class GateResult(ResponseModel):
    """The rollout gate: the current and the candidate policy on the pool's recorded
    traffic, side by side."""

    pool: str
    current_policy: str = Field(description="the pool's policy after this call")
    traffic: GateTraffic
    current: PolicyOutcome
    candidate: PolicyOutcome
    no_worse_on_slo: bool
    judged_on: str = Field(
        description="client_slo_attainment when the latency model carries the time outside "
        "the batcher, else slo_attainment (the batcher's own account)"
    )
    latency_model: str = Field(description="the latency model the replay ran on")
    promoted: bool
