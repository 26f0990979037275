"""The worker's Prometheus metrics, named and unitised by Prometheus' conventions.

Per-request and per-batch distributions are histograms observed as things happen; the
rest (queue depth, config in force, warmed buckets, counters) is read from the batcher
at scrape time, so a scrape always sees the current state.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from server.worker.batching import DynamicBatcher, Served

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = tuple(float(1 << i) for i in range(11))
FILL_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
BACKGROUND_TASKS = ("dispatch", "batch", "warm-up", "link-report", "link-config")


class WorkerMetrics:
    def __init__(
        self, registry: CollectorRegistry, batcher: DynamicBatcher, model: str = "unknown"
    ) -> None:
        self.batcher = batcher
        self.model = model
        self.requests = Counter(
            "tidal_worker_requests", "Requests by outcome.", ["outcome"], registry=registry
        )
        self.latency = Histogram(
            "tidal_worker_request_latency_seconds",
            "Time from arrival in the queue to the answer, served requests.",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "tidal_worker_queue_wait_seconds",
            "Time a served request waited in the queue.",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.ingress = Histogram(
            "tidal_worker_ingress_seconds",
            "Time from a request's arrival at the worker's socket (the client's X-Sent-At, "
            "else the handler's start) to the batcher: the HTTP layer's queue.",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.batch_size = Histogram(
            "tidal_worker_batch_size",
            "Requests per batch.",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.batch_fill = Histogram(
            "tidal_worker_batch_fill_ratio",
            "Batch size over the cap in force.",
            buckets=FILL_BUCKETS,
            registry=registry,
        )
        self.execution = Histogram(
            "tidal_worker_batch_execution_seconds",
            "Model execution time per batch.",
            buckets=LATENCY_BUCKETS_S,
            registry=registry,
        )
        batcher.on_batch = self._batch
        registry.register(_StateCollector(self))

    def served(self, served: Served) -> None:
        self.requests.labels("ok").inc()
        self.latency.observe(served.queue_wait_s + served.execution_s)
        self.queue_wait.observe(served.queue_wait_s)

    def outcome(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()

    def _batch(self, size: int, cap: int, execution_s: float) -> None:
        self.batch_size.observe(size)
        self.batch_fill.observe(size / cap)
        self.execution.observe(execution_s)


class _StateCollector:
    """Gauges and counters read from the batcher at scrape time."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def collect(self):
        b = self.metrics.batcher
        s = b.stats
        info = GaugeMetricFamily(
            "tidal_worker_model_info", "1, labelled with the model served.", labels=["model"]
        )
        info.add_metric([self.metrics.model], 1.0)
        yield info
        yield _gauge("tidal_worker_queue_depth", "Requests waiting.", b.queue_depth)
        bound = b.queue_bound
        yield _gauge(
            "tidal_worker_queue_bound",
            "Most requests that may wait (past it: 429): the SLO times the measured service "
            "rate, at least a full batch per instance, or --max-queue; +Inf if unbounded.",
            math.inf if bound is None else bound,
        )
        yield _gauge(
            "tidal_worker_config_max_batch_size", "Batch cap asked for.", b.config.max_batch_size
        )
        yield _gauge(
            "tidal_worker_config_timeout_seconds", "Batch timeout in force.", b.config.timeout_s
        )
        yield _gauge("tidal_worker_config_version", "Version of the config in force.", b.version)
        yield _gauge(
            "tidal_worker_serving_max_batch_size", "Cap served (warmed, memory).", b.serving_cap
        )
        memory = b.memory_max_batch
        yield _gauge(
            "tidal_worker_memory_max_batch_size",
            "The largest batch the model's memory allows, measured at start (caps above it "
            "are refused or clamped); +Inf if no bound is known.",
            math.inf if memory is None else memory,
        )
        warm = GaugeMetricFamily(
            "tidal_worker_bucket_warm",
            "Each batch-size bucket kept: 1 warm, 0 warming (a released bucket's series ends).",
            labels=["size"],
        )
        for bucket in b.warmed_buckets:
            warm.add_metric([str(bucket)], 1.0)
        for bucket in b.warming_buckets:
            warm.add_metric([str(bucket)], 0.0)
        yield warm
        warmup = GaugeMetricFamily(
            "tidal_worker_warmup_seconds",
            "Measured warm-up time of each bucket warm now (a released bucket's series ends).",
            labels=["size"],
        )
        for bucket in b.warmed_buckets:
            if bucket in s.warmup_s:
                warmup.add_metric([str(bucket)], s.warmup_s[bucket])
        yield warmup
        yield _counter(
            "tidal_worker_busy_seconds",
            "Seconds the model instances ran batches: rate() over "
            "tidal_worker_model_instances is the busy ratio.",
            s.busy_s,
        )
        yield _gauge(
            "tidal_worker_model_instances", "Model instances running batches.", b.instances
        )
        yield _counter(
            "tidal_worker_oom_splits", "Batches split after running out of memory.", s.oom_splits
        )
        yield _counter(
            "tidal_worker_warmup_ooms",
            "Bucket warm-ups that ran out of memory (the accepted cap drops to what warmed).",
            s.warmup_ooms,
        )
        errors = CounterMetricFamily(
            "tidal_worker_background_errors",
            "Failures of background tasks (dispatch, warm-up, link loops), logged with tracebacks.",
            labels=["task"],
        )
        # Every task from the start, at 0: rate() and increase() read 0, not no data.
        for task in sorted({*BACKGROUND_TASKS, *b.errors.counts}):
            errors.add_metric([task], b.errors.counts.get(task, 0))
        yield errors
        yield _gauge("tidal_worker_ready", "1 while the dispatch loop runs, else 0.", b.ready)
        yield _gauge(
            "tidal_worker_padding_waste_ratio",
            "Mean share of padded slots in variable-length batches.",
            s.padding_waste_sum / s.batches if s.batches else 0.0,
        )


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)
