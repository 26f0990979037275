"""What the operator API shows of a pool: a `PoolControl` read into response models.

Each function reads one aspect of a running pool (its status, health, forecast, latency
model, members) and returns the model its route answers with (`server.control.schemas`),
so what a handler returns is checked against what the OpenAPI promises. Nothing here
changes the pool.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
from redis.exceptions import RedisError

from adaptive.decisions import Mode, config_dict
from adaptive.histogram import NUM_BUCKETS, add_buckets, quantile_from_counts
from adaptive.latency import profile_document
from adaptive.learned_latency import PLANNED_SIZES
from server.control.loop import member_ready
from server.control.plane import PoolControl
from server.control.schemas import (
    BackgroundJobs,
    ForecastBody,
    ForecastPoint,
    LatencyModelSummary,
    LatencyProfile,
    PoolForecast,
    PoolHealth,
    PoolSummary,
    RatePoint,
    WindowStats,
    WorkerRow,
)


def pool_health(control: PoolControl) -> PoolHealth:
    """A pool's readiness and what went wrong, for /readyz and the pool's status."""
    loop = control.loop
    if loop is None:
        status = f"failed to start: {control.start_error}" if control.start_error else "starting"
        return PoolHealth(ready=False, status=status, errors={}, settings_error=None)
    state = loop.state
    if state.ready:
        status = "ticking"
    elif state.ticks == 0 and not state.errors:
        status = "starting"
    else:
        status = f"tick failing: {state.last_error}"
    return PoolHealth(
        ready=state.ready,
        status=status,
        last_error=state.last_error,
        errors=dict(state.errors),
        malformed_stats=state.malformed_stats,
        settings_error=control.settings_error,
    )


async def pool_summary(control: PoolControl) -> PoolSummary:
    """A running pool's status (`GET /v1/pools/{pool}`). A new field: declare it on
    `PoolSummary`, then fill it here."""
    controller, state = control.controller, control.loop.state
    leader = None
    with contextlib.suppress(RedisError, OSError):
        leader = await control.bus.leader(control.pool)
    pinned = control.active_override()
    infeasible_since = controller.slo_infeasible_since
    return PoolSummary(
        pool=control.pool,
        config=config_dict(controller.config),
        version=state.version,
        policy=control.policy_spec,
        shadow=controller.shadow.spec if controller.shadow is not None else None,
        slo_ms=round(controller.settings.slo_s * 1e3, 3),
        mode="override" if pinned else controller.mode.value,
        mode_reason=controller.mode_reason if controller.mode is Mode.FALLBACK else None,
        override=pinned.to_dict() if pinned else None,
        events=[e.name for e in control.events],
        leader=leader,
        this_controller={"name": control.holder, "leading": state.leader},
        ready=state.ready,
        workers_alive=state.workers_alive,
        workers_ready=state.workers_ready,
        workers_not_ready=state.not_ready,
        desired_replicas=controller.replicas,
        slo_feasible=infeasible_since is None,
        slo_infeasible_for_s=None
        if infeasible_since is None
        else round(control.loop.clock.now() - infeasible_since, 1),
        engines=dict(sorted(state.engines.items())),
        refusing=state.refusing,
        unplanned_reloads=state.unplanned_reloads,
        ticks=state.ticks,
        last_tick_ms=round(state.last_tick_s * 1e3, 3),
        last_error=state.last_error,
        jobs=BackgroundJobs(
            refits=state.refits,
            replans=state.replans,
            failed=dict(sorted(state.job_failures.items())),
            last_failure=state.last_job_error,
            dropped=state.jobs_dropped,
        ),
        health=pool_health(control),
        config_changes=controller.config_changes,
        fallback_s=controller.fallback_s,
        last_decision=controller.last.to_dict() if controller.last else None,
    )


def pool_forecast(control: PoolControl) -> PoolForecast:
    """The forecast the policy plans with, and the last 60 steps of actual traffic."""
    feed = control.controller.feed
    if feed is None:
        return PoolForecast(pool=control.pool, forecast=None, note="this policy does not forecast")
    actual = feed.history
    recent = actual.counts[-60:]
    start = actual.start_s + actual.step_s * (actual.counts.size - recent.size)
    return PoolForecast(
        pool=control.pool,
        step_s=feed.step_s,
        forecast=None if feed.forecast is None else _forecast_body(feed.forecast),
        actual=[
            RatePoint(time=round(start + i * actual.step_s, 3), rps=_round(c / actual.step_s))
            for i, c in enumerate(recent)
        ],
        steps_scored=feed.steps_scored,
        steps_outside_band=feed.steps_outside,
    )


def _forecast_body(f) -> ForecastBody:
    points = zip(_iter(f.times_s), f.mean_rps, f.lower_rps, f.upper_rps, strict=True)
    return ForecastBody(
        model=f.model,
        fallback=f.fallback,
        level=f.level,
        band=f.band,
        events=list(f.events),
        points=[
            ForecastPoint(
                time=round(float(t), 3),
                mean_rps=_round(m),
                lower_rps=_round(lo),
                upper_rps=_round(hi),
            )
            for t, m, lo, hi in points
        ],
    )


def latency_profile(control: PoolControl) -> LatencyProfile:
    """The latency model learned from serving as the profile `simulate` loads."""
    learner = control.controller.latency
    sizes = [e.batch_size for e in learner.estimates()] if learner else PLANNED_SIZES
    return LatencyProfile.model_validate(profile_document(control.latency_model(), sizes))


def latency_summary(control: PoolControl) -> LatencyModelSummary:
    """The latency model learned from serving, per padded batch size, with its source."""
    controller = control.controller
    learner = controller.latency
    drift = learner.drift(controller.planned_latency) if learner is not None else None
    planned = controller.planned_latency
    return LatencyModelSummary(
        pool=control.pool,
        prior=control.plan.latency.describe(),
        model=control.latency_model().describe(),
        planned_with=planned.describe() if planned is not None else None,
        measured_batches=round(learner.measured_batches, 1) if learner else 0,
        drift=None
        if drift is None or drift.batch_size is None
        else {
            "relative": round(drift.relative, 4),
            "batch_size": drift.batch_size,
            "measure": drift.measure,
        },
        rebuilds=controller.replans,
        last_rebuild=controller.last_replan,
        learning=_learning(controller.settings.learning),
        sizes=[e.to_dict() for e in learner.estimates()] if learner else [],
    )


def _learning(learning) -> dict[str, Any]:
    return {
        "half_life_s": learning.half_life_s,
        "prior_batches": learning.prior_batches,
        "min_batches": learning.min_batches,
        # None: learn and show only, never rebuild (--latency-drift 0).
        "drift_threshold": learning.drift_threshold
        if math.isfinite(learning.drift_threshold)
        else None,
        "min_interval_s": learning.min_interval_s,
    }


def worker_rows(control: PoolControl, alive: dict[str, dict[str, Any]]) -> list[WorkerRow]:
    """The pool's members alive (their heartbeats, by name) with their last stats."""
    latest = control.loop.latest
    now = time.time()
    return [
        WorkerRow.model_validate(
            {
                "name": name,
                "heartbeat_age_s": round(now - info.get("time", now), 3),
                **{k: v for k, v in info.items() if k != "time"},
                "ready": member_ready(info),  # an older worker's beat does not say
                "last_stats": window_stats(latest.get(name)),
            }
        )
        for name, info in sorted(alive.items())
    ]


def window_stats(stats) -> WindowStats | None:
    """A member's last `WorkerStats` window as the API shows it."""
    if stats is None:
        return None
    return WindowStats(
        window_s=stats.window_s,
        arrivals=stats.arrivals,
        completed=stats.completed,
        shed=stats.shed,
        queue_depth=stats.queue_depth,
        busy_s=round(stats.busy_s, 6),
        batch_sizes=dict(stats.batch_sizes),
        max_batch_size=stats.max_batch_size,
        # None: an engine without warm-up (Triton) has no warmed sizes to report.
        warmed_buckets=None if stats.warmed_buckets is None else list(stats.warmed_buckets),
        config_version=stats.config_version,
        # The worker's HTTP layer's queue, socket to batcher, over the window.
        ingress_p50_ms=_sparse_quantile_ms(stats.ingress_buckets, 0.5),
        ingress_p99_ms=_sparse_quantile_ms(stats.ingress_buckets, 0.99),
    )


def _iter(values) -> Iterable[float]:
    return (float(v) for v in values)


def _round(value: float) -> float | None:
    return round(float(value), 3) if math.isfinite(value) else None


def _sparse_quantile_ms(buckets: tuple[tuple[int, int], ...], q: float) -> float | None:
    if not buckets:
        return None
    value = quantile_from_counts(add_buckets(np.zeros(NUM_BUCKETS, dtype=np.int64), buckets), q)
    return None if value is None else round(value * 1e3, 3)
