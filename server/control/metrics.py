"""The control plane's Prometheus metrics, one label set per pool.

Decisions and tick durations are counted as ticks happen; the rest (config in force,
forecast, mode, leadership, workers alive) is read from each pool's control at scrape
time, so a scrape always sees the current state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from adaptive.decisions import DecisionRecord, Mode
from server.control.loop import ControlLoop
from server.control.plane import PoolControl

TICK_STAGES = ("elect", "read", "step", "publish", "record", "trim")
"""The stages a tick fails at (`server.control.loop`), each exported from the start."""
TICK_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.decisions = Counter(
            "tidal_controller_decisions",
            "Control decisions by pool, policy and kind (hold, scale_up, scale_down, "
            "scale_out, scale_in, warm_ahead, retune, guarded, fallback, override).",
            ["pool", "policy", "kind"],
            registry=registry,
        )
        self.tick = Histogram(
            "tidal_controller_tick_duration_seconds",
            "Wall time of one control tick: read stats, decide, publish.",
            ["pool"],
            buckets=TICK_BUCKETS_S,
            registry=registry,
        )

    def observe(self, loop: ControlLoop, record: DecisionRecord | None) -> None:
        """The loop's tick observer."""
        self.tick.labels(loop.pool).observe(loop.state.last_tick_s)
        if record is not None:
            self.decisions.labels(loop.pool, record.policy, record.kind).inc()

    def watch(self, pools: Callable[[], Iterable[PoolControl]]) -> None:
        self.registry.register(_PoolCollector(pools))


class _PoolCollector:
    def __init__(self, pools: Callable[[], Iterable[PoolControl]]) -> None:
        self.pools = pools

    def collect(self):
        gauges = {
            name: GaugeMetricFamily(f"tidal_controller_{name}", help_text, labels=["pool"])
            for name, help_text in (
                ("config_max_batch_size", "Batch cap of the config in force."),
                ("config_timeout_seconds", "Batch timeout of the config in force."),
                ("config_warm_max_batch_size", "Largest batch kept warm by the config."),
                ("config_version", "Version of the config in force."),
                ("fallback_active", "1 while the fallback policy decides."),
                ("override_active", "1 while an operator override pins the config."),
                ("leader", "1 while this controller leads the pool."),
                ("ready", "1 while the bus is reachable and ticks run."),
                ("workers_alive", "Workers heartbeating in the pool."),
                (
                    "workers_ready",
                    "Workers heartbeating and ready (warm, dispatch loop alive); below "
                    "workers_alive while one warms up or cannot dispatch.",
                ),
                (
                    "members_refusing_config",
                    "Members whose engine refused a newer config and serve an older one.",
                ),
                ("forecast_error_requests_per_second", "Actual minus forecast mean, last step."),
                (
                    "slo_infeasible",
                    "1 while the policy predicts that no config meets the SLO at the load it "
                    "plans for (it holds the best it predicts).",
                ),
                (
                    "desired_replicas",
                    "Replicas the pool should have (a fleet that scales: --max-replicas); "
                    "an HPA or KEDA external metric can act on it.",
                ),
            )
        }
        forecast = GaugeMetricFamily(
            "tidal_controller_forecast_requests_per_second",
            "The forecast for the current step: mean and band bounds.",
            labels=["pool", "bound"],
        )
        errors = CounterMetricFamily(
            "tidal_controller_tick_errors",
            "Control ticks that failed, by the stage that failed (elect, read, step, "
            "publish, record, trim; each at 0 from the start).",
            labels=["pool", "stage"],
        )
        jobs = CounterMetricFamily(
            "tidal_controller_background_jobs",
            "The controller's background jobs (kind: refit, replan) by outcome: "
            "done, failed (kept what it had, retried after a backoff), dropped (it "
            "finished after its controller was replaced; kind any).",
            labels=["pool", "kind", "outcome"],
        )
        malformed = CounterMetricFamily(
            "tidal_controller_malformed_stats",
            "Worker stats entries skipped because they did not parse.",
            labels=["pool"],
        )
        members = GaugeMetricFamily(
            "tidal_controller_members",
            "Pool members heartbeating, by engine (tidal-worker, ray-serve, triton).",
            labels=["pool", "engine"],
        )
        scored = CounterMetricFamily(
            "tidal_controller_forecast_steps",
            "Forecast steps scored against actual load, and those outside the band.",
            labels=["pool", "outcome"],
        )
        rebuilds = CounterMetricFamily(
            "tidal_controller_latency_model_rebuilds",
            "Planner's tables rebuilt because the latency measured while serving drifted.",
            labels=["pool"],
        )
        drift = GaugeMetricFamily(
            "tidal_controller_latency_model_drift_ratio",
            "Largest relative change in mean or p99 execution time, at a batch size with "
            "enough batches, between the latency learned from serving and the planner's.",
            labels=["pool"],
        )
        policy = GaugeMetricFamily(
            "tidal_controller_policy_info",
            "1, labelled with the pool's policy spec and its shadow's (empty: none).",
            labels=["pool", "policy", "shadow"],
        )
        for control in self.pools():
            if control.loop is None:
                continue
            pool, controller, state = control.pool, control.controller, control.loop.state
            config = controller.config
            values = {
                "config_max_batch_size": config.max_batch_size,
                "config_timeout_seconds": config.timeout_s,
                "config_warm_max_batch_size": config.warm_target,
                "config_version": state.version,
                "fallback_active": float(controller.mode is Mode.FALLBACK),
                "override_active": float(control.active_override() is not None),
                "leader": float(state.leader),
                "ready": float(state.ready),
                "workers_alive": state.workers_alive,
                "workers_ready": state.workers_ready,
                "members_refusing_config": len(state.refusing),
            }
            for stage in sorted({*TICK_STAGES, *state.errors}):
                errors.add_metric([pool, stage], state.errors.get(stage, 0))
            shadow = controller.shadow.spec if controller.shadow is not None else ""
            policy.add_metric([pool, control.policy_spec, shadow], 1.0)
            malformed.add_metric([pool], state.malformed_stats)
            jobs.add_metric([pool, "refit", "done"], state.refits)
            jobs.add_metric([pool, "replan", "done"], state.replans)
            for kind in ("refit", "replan"):
                jobs.add_metric([pool, kind, "failed"], state.job_failures.get(kind, 0))
            jobs.add_metric([pool, "any", "dropped"], state.jobs_dropped)
            for engine, count in sorted(state.engines.items()):
                members.add_metric([pool, engine], count)
            if controller.replicas is not None:
                values["desired_replicas"] = controller.replicas
            values["slo_infeasible"] = int(controller.slo_infeasible_since is not None)
            feed = controller.feed
            if feed is not None and feed.last_error_rps is not None:
                values["forecast_error_requests_per_second"] = feed.last_error_rps
            for name, value in values.items():
                gauges[name].add_metric([pool], float(value))
            if feed is not None and feed.forecast is not None:
                f = feed.forecast
                for bound, series in (
                    ("mean", f.mean_rps),
                    ("lower", f.lower_rps),
                    ("upper", f.upper_rps),
                ):
                    forecast.add_metric([pool, bound], float(series[0]))
            rebuilds.add_metric([pool], controller.replans)
            if controller.latency is not None:
                moved = controller.latency.drift(controller.planned_latency)
                if moved.batch_size is not None:
                    drift.add_metric([pool], moved.relative)
            if feed is not None:
                scored.add_metric([pool, "inside"], feed.steps_scored - feed.steps_outside)
                scored.add_metric([pool, "outside"], feed.steps_outside)
        yield from gauges.values()
        yield forecast
        yield scored
        yield errors
        yield jobs
        yield malformed
        yield members
        yield rebuilds
        yield drift
        yield policy
