"""A Triton model as an `Engine`: steered from beside Triton, over gRPC and /metrics.

Triton forms its batches itself (its dynamic batcher), so Tidal cannot reach into it the
way it steers its own worker. What it can do from outside: read the model's config, load
it again with `max_batch_size` and `dynamic_batching.max_queue_delay_microseconds`
changed (a config override, over gRPC: an HTTP load call stalls the requests queued on
its connection for the reload, a gRPC one does not), read it back, and read what Triton
served from its Prometheus metrics. That is this module: `TritonEngine` runs on a
`server.engines.member.PoolMember` in `tidal engine triton` (server/engines/triton_cli.py).

What a change costs: a reload (Triton loads a new instance beside the old one, which
serves until the swap; 2-3.5 s measured here), so `change_cost` is a `reload_s`, the
mean of the reloads this engine has timed (the configured value until one is timed).

What is exact and what is not (docs/triton.md says the same):

- Counts are deltas of Triton's Prometheus counters, which survive reloads (its
  statistics API resets on each). A counter that goes down means Triton restarted: the
  window then counts from zero. Arrivals are the requests that ended (succeeded or
  failed) plus the growth of the pending queue; failures count as `shed`.
- Batch sizes, batches and busy seconds come from the statistics API's per-batch-size
  execution counts and compute times, exact, in every window where those counters ran on
  (no reload or restart reset them); in a window where they were reset, from the
  metrics' means: one entry at the rounded mean batch size, with the exact batch count
  and item sum, and busy seconds as the per-request compute time over requests per
  execution. `status()` counts those windows (`approximate_windows`).
- Latency: the count and sum are exact per window; Triton exports no latency histogram
  for a model that is not decoupled, so the window's histogram is shaped from Triton's
  request-latency summary (`--metrics-config summary_latencies=true`), whose quantiles
  cover a sliding window of about a minute, not the report's second. Without the
  summary, every request of the window sits at the window's mean latency.

Overrides live in Triton's memory only: a restarted Triton serves its disk config again.
A watch reads the config back every few seconds; when it differs from what this engine
put in force (and no change is under way), the engine loads its config again.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException

from adaptive.bus import VersionedConfig, WorkerStats
from adaptive.change_cost import ChangeCost
from adaptive.clock import Clock
from adaptive.config import BatchConfig
from adaptive.histogram import BUCKET_LOWER_S
from server.engines.member import EngineUnreachable
from server.engines.protocols import ConfigRejected
from server.tasks import BackgroundErrors, cancel_and_wait, spawn

log = logging.getLogger("tidal.triton")

DEFAULT_RELOAD_S = 3.0
"""What a change is said to cost until this engine has timed a reload."""
WATCH_INTERVAL_S = 2.0
"""How often the config Triton serves is read back (a restart loses the override)."""
LOAD_TIMEOUT_S = 120.0
"""A reload that takes longer than this is a failure, not a reload."""
READ_TIMEOUT_S = 2.0
"""Metrics, statistics and config reads: each is milliseconds on a healthy Triton."""

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_COUNTERS = {
    "nv_inference_request_success": "success",
    "nv_inference_request_failure": "failure",
    "nv_inference_count": "inferences",
    "nv_inference_exec_count": "executions",
    "nv_inference_request_duration_us": "request_us",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_input_duration_us": "input_us",
    "nv_inference_compute_infer_duration_us": "infer_us",
    "nv_inference_compute_output_duration_us": "output_us",
}
_PENDING = "nv_inference_pending_request_count"
_SUMMARY = "nv_inference_request_summary_us"


class TritonUnreachable(EngineUnreachable):
    """Triton did not answer (down, restarting, or the address is wrong): an outage to
    the member, which logs it once and beats on with the member not ready; the next
    window covers the time it was away."""


@dataclass(frozen=True, slots=True)
class TritonCounters:
    """One model's counters in one /metrics scrape, summed over its versions."""

    success: float = 0.0
    failure: float = 0.0
    inferences: float = 0.0
    executions: float = 0.0
    request_us: float = 0.0
    queue_us: float = 0.0
    input_us: float = 0.0
    infer_us: float = 0.0
    output_us: float = 0.0
    pending: float = 0.0
    # The request-latency summary's (quantile, microseconds), NaN-free; () when Triton
    # runs without summary_latencies=true or has served nothing for a minute.
    quantiles_us: tuple[tuple[float, float], ...] = ()

    def went_back_from(self, before: TritonCounters) -> bool:
        """A counter decreased: Triton restarted (or the model was unloaded) between."""
        return any(getattr(self, name) < getattr(before, name) for name in _COUNTERS.values())


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """The statistics API's per-batch-size executions: (size, executions, busy ns)."""

    sizes: tuple[tuple[int, int, int], ...] = ()

    @property
    def executions(self) -> int:
        return sum(n for _, n, _ in self.sizes)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What Triton said at one instant; `batches` None when the statistics API did not
    answer."""

    counters: TritonCounters
    batches: BatchCounts | None


@dataclass(frozen=True, slots=True)
class Knobs:
    """The two settings Tidal steers, as Triton's config holds them."""

    max_batch_size: int
    max_queue_delay_us: int

    @classmethod
    def of(cls, config: BatchConfig) -> Knobs:
        return cls(config.max_batch_size, round(config.timeout_s * 1e6))

    @classmethod
    def read(cls, model_config: Mapping[str, Any]) -> Knobs:
        batching = model_config.get("dynamic_batching") or {}
        # protobuf's JSON leaves out zeros and writes 64-bit integers as strings
        delay = int(batching.get("max_queue_delay_microseconds", 0) or 0)
        return cls(int(model_config.get("max_batch_size", 0) or 0), delay)

    def describe(self) -> str:
        return f"max_batch={self.max_batch_size},timeout={self.max_queue_delay_us / 1e3:g}ms"


def parse_metrics(text: str, model: str) -> TritonCounters:
    """The counters of `model` in a Prometheus text scrape of Triton's /metrics."""
    sums = dict.fromkeys(_COUNTERS.values(), 0.0)
    pending = 0.0
    quantiles: dict[float, float] = {}
    for line in text.splitlines():
        if not line.startswith("nv_inference_"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels_text, value_text = match.groups()
        labels = dict(_LABEL.findall(labels_text or ""))
        if labels.get("model") != model:
            continue
        value = float(value_text)  # "Nan" parses, and is dropped below
        if not math.isfinite(value):
            continue
        if name in _COUNTERS:
            sums[_COUNTERS[name]] += value
        elif name == _PENDING:
            pending += value
        elif name == _SUMMARY and "quantile" in labels:
            q = float(labels["quantile"])
            quantiles[q] = max(quantiles.get(q, 0.0), value)  # several versions: the worst
    return TritonCounters(**sums, pending=pending, quantiles_us=tuple(sorted(quantiles.items())))


def parse_batch_stats(statistics: Mapping[str, Any], model: str) -> BatchCounts:
    """Executions and busy time per batch size from the statistics API's JSON
    (`get_inference_statistics(as_json=True)`), summed over the model's versions. Busy
    time is compute input + infer + output: the instance is occupied for all three."""
    per_size: dict[int, list[int]] = {}
    for entry in statistics.get("model_stats", []):
        if entry.get("name") != model:
            continue
        for batch in entry.get("batch_stats", []):
            size = int(batch["batch_size"])
            executions = int(batch.get("compute_infer", {}).get("count", 0))
            busy_ns = sum(
                int(batch.get(stage, {}).get("ns", 0))
                for stage in ("compute_input", "compute_infer", "compute_output")
            )
            totals = per_size.setdefault(size, [0, 0])
            totals[0] += executions
            totals[1] += busy_ns
    return BatchCounts(tuple((s, n, ns) for s, (n, ns) in sorted(per_size.items())))


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """How one window's batch figures were read (for `status()` and the tests)."""

    restarted: bool  # the metrics' counters went back: counted from zero
    exact_batches: bool  # batch sizes and busy time from the statistics API


def window_stats(
    before: Snapshot,
    after: Snapshot,
    *,
    worker: str,
    window_s: float,
    max_batch_size: int,
    config_version: int,
) -> tuple[WorkerStats, WindowFigures]:
    """One report's `WorkerStats` from two snapshots of Triton's counters."""
    restarted = after.counters.went_back_from(before.counters)
    base = TritonCounters() if restarted else before.counters
    now = after.counters
    completed = _count(now.success - base.success)
    failed = _count(now.failure - base.failure)
    queue_growth = now.pending - (0.0 if restarted else base.pending)
    arrivals = max(0, completed + failed + round(queue_growth))
    request_s = max(0.0, now.request_us - base.request_us) / 1e6
    mean_s = request_s / completed if completed else 0.0
    batches = _batch_delta(before.batches, after.batches, restarted)
    if batches is not None:
        sizes = tuple((s, n) for s, n, _ in batches.sizes if n > 0)
        busy_s = sum(ns for _, _, ns in batches.sizes) / 1e9
        executions = sum(n for _, n in sizes)
        items = sum(s * n for s, n in sizes)
    else:  # the statistics API was reset or did not answer: the metrics' means
        executions = _count(now.executions - base.executions)
        items = _count(now.inferences - base.inferences)
        requests = completed + failed
        compute_us = (now.input_us + now.infer_us + now.output_us) - (
            base.input_us + base.infer_us + base.output_us
        )
        per_request_s = max(0.0, compute_us) / 1e6
        # Each request of a batch is charged the batch's compute time: divide by the
        # requests per execution (exact when a window's batches are all one size).
        busy_s = per_request_s * executions / requests if requests else 0.0
        sizes = ((max(1, round(items / executions)), executions),) if executions else ()
    stats = WorkerStats(
        worker=worker,
        window_s=window_s,
        arrivals=arrivals,
        completed=completed,
        shed=failed,
        latency_buckets=latency_buckets(completed, mean_s, now.quantiles_us),
        latency_sum_s=request_s,
        batch_sizes=sizes,
        busy_s=busy_s,
        queue_depth=_count(now.pending),
        max_batch_size=max_batch_size,
        warmed_buckets=None,  # Triton has no warm-up Tidal can see or steer
        config_version=config_version,
        batches=executions,
        batch_size_sum=items,
        fill_sum=items / max(max_batch_size, 1),
    )
    return stats, WindowFigures(restarted, batches is not None)


def _count(value: float) -> int:
    return max(0, round(value))


def _batch_delta(
    before: BatchCounts | None, after: BatchCounts | None, restarted: bool
) -> BatchCounts | None:
    """The window's executions per batch size, or None where they cannot be exact: the
    statistics API did not answer, or its counters were reset (a reload, a restart)."""
    if before is None or after is None or restarted:
        return None
    old = {s: (n, ns) for s, n, ns in before.sizes}
    sizes = []
    for size, n, ns in after.sizes:
        n0, ns0 = old.pop(size, (0, 0))
        if n < n0 or ns < ns0:
            return None
        sizes.append((size, n - n0, ns - ns0))
    if old:  # a size it had counted is gone: reset
        return None
    return BatchCounts(tuple(sizes))


def latency_buckets(
    completed: int, mean_s: float, quantiles_us: Iterable[tuple[float, float]]
) -> tuple[tuple[int, int], ...]:
    """A histogram of `completed` requests (sparse `adaptive.histogram` buckets) whose
    nearest-rank quantiles are Triton's summary quantiles: the requests up to each
    quantile's rank sit at its value (the tail past the last one, at the last). With no
    quantiles, all of them sit at the window's mean."""
    if completed <= 0:
        return ()
    points = [(q, us / 1e6) for q, us in quantiles_us if 0 < q <= 1 and us >= 0]
    if points:
        qs = np.array([q for q, _ in points])
        values = np.maximum.accumulate(np.array([v for _, v in points]))
        ranks = np.minimum(np.ceil(completed * qs - 1e-9).astype(np.int64), completed)
        ranks[-1] = completed
        counts = np.diff(np.concatenate(([0], np.maximum.accumulate(ranks))))
    else:
        values, counts = np.array([mean_s]), np.array([completed])
    index = np.searchsorted(BUCKET_LOWER_S, values, side="right") - 1
    merged: dict[int, int] = {}
    for i, n in zip(index.tolist(), counts.tolist(), strict=True):
        if n > 0:
            merged[i] = merged.get(i, 0) + n
    return tuple(sorted(merged.items()))


def override_config(model_config: Mapping[str, Any], config: BatchConfig) -> dict[str, Any]:
    """The model's config with Tidal's two knobs set: the override to load. A stale
    `preferred_batch_size` goes (Triton fills it in again from the new cap); everything
    else is the model's own. `warm_max_batch` has no Triton counterpart."""
    override = copy.deepcopy(dict(model_config))
    override["max_batch_size"] = config.max_batch_size
    batching = dict(override.get("dynamic_batching") or {})
    batching.pop("preferred_batch_size", None)
    batching["max_queue_delay_microseconds"] = str(Knobs.of(config).max_queue_delay_us)
    override["dynamic_batching"] = batching
    return override


def rejection_reason(error: InferenceServerException) -> str:
    """Triton's message, without the backend's traceback (`At: ...`), on one line."""
    text = error.message() or str(error)
    text = text.split("\n\nAt:", 1)[0]
    return " ".join(text.split())


def _is_rejection(error: InferenceServerException) -> bool:
    # Triton answers a load it refuses (a bad config, a backend's initialize raising)
    # with INVALID_ARGUMENT; UNAVAILABLE and the like say it did not get that far.
    return "INVALID_ARGUMENT" in str(error.status() or "")


@dataclass
class _Counts:
    reloads_s: list[float] = field(default_factory=list)
    rejected: int = 0
    restarts_detected: int = 0
    reapplied: int = 0
    approximate_windows: int = 0
    counter_resets: int = 0


class TritonEngine:
    """One Triton model steered by a pool: `apply` loads a config override over gRPC and
    returns once Triton serves it; `collect` reads Triton's counters as a window."""

    kind = "triton"

    def __init__(
        self,
        grpc_url: str,
        metrics_url: str,
        model: str,
        worker: str,
        clock: Clock,
        errors: BackgroundErrors,
        reload_s: float = DEFAULT_RELOAD_S,
        watch_interval_s: float = WATCH_INTERVAL_S,
    ) -> None:
        self.grpc_url = grpc_url
        self.metrics_url = metrics_url
        self.model = model
        self.worker = worker
        self.clock = clock
        self.errors = errors
        self.configured_reload_s = reload_s
        self.watch_interval_s = watch_interval_s
        self.counts = _Counts()
        self._version = 0
        self._applied: Knobs | None = None  # what this engine put in force
        self._serving: Knobs | None = None  # what Triton said it serves, last read
        self._last: Snapshot | None = None
        self._window_started_at = 0.0
        self._lock = asyncio.Lock()  # one load at a time: the member's, or the watch's
        self._client: InferenceServerClient | None = None
        self._http: httpx.AsyncClient | None = None
        self._watch: asyncio.Task | None = None
        self._loaded_since_snapshot = False

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Connect, read the model's config and counters (the first window's start) and
        watch the config Triton serves. Raises `TritonUnreachable` if Triton does not
        answer, `ConfigRejected` if the model cannot batch at all."""
        self._client = InferenceServerClient(self.grpc_url)
        self._http = httpx.AsyncClient(timeout=READ_TIMEOUT_S)
        knobs = Knobs.read(await self._read_config())
        if knobs.max_batch_size < 1:
            raise ConfigRejected(
                f"model {self.model!r} has max_batch_size 0: Triton does not batch it, "
                "so there is nothing to steer"
            )
        self._serving = knobs
        self._last = await self._snapshot()
        self._window_started_at = self.clock.now()
        self._watch = spawn(self._watch_loop(), "triton-watch", self.errors)

    async def close(self) -> None:
        if self._watch is not None:
            await cancel_and_wait(self._watch)
        if self._http is not None:
            await self._http.aclose()
        if self._client is not None:
            await self._client.close()

    # -- Engine ----------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    @property
    def change_cost(self) -> ChangeCost:
        timed = self.counts.reloads_s[-10:]
        reload_s = sum(timed) / len(timed) if timed else self.configured_reload_s
        return ChangeCost(reload_s=round(reload_s, 2))

    async def apply(self, published: VersionedConfig) -> None:
        async with self._lock:
            await self._put_in_force(Knobs.of(published.config), published.config)
            self._version = published.version
            self._applied = Knobs.of(published.config)

    async def collect(self) -> WorkerStats:
        assert self._last is not None, "start() first"
        snapshot = await self._snapshot()
        before = self._last
        if self._loaded_since_snapshot:
            # A reload resets the statistics API: this window's batch figures come from
            # the metrics' means (see the module's docstring).
            before, self._loaded_since_snapshot = Snapshot(before.counters, None), False
        now = self.clock.now()
        window_s, self._window_started_at = now - self._window_started_at, now
        serving = self._serving or Knobs(1, 0)
        stats, figures = window_stats(
            before,
            snapshot,
            worker=self.worker,
            window_s=window_s,
            max_batch_size=serving.max_batch_size,
            config_version=self._version,
        )
        self._last = snapshot
        if figures.restarted:
            self.counts.counter_resets += 1
            log.warning(
                "triton %s: its counters went back (a restart): counting from zero", self.model
            )
        if not figures.exact_batches:
            self.counts.approximate_windows += 1
        return stats

    def status(self) -> dict[str, Any]:
        serving = self._serving
        timed = self.counts.reloads_s
        return {
            "queue_depth": _count(self._last.counters.pending) if self._last else 0,
            "serving_max_batch": serving.max_batch_size if serving else None,
            "serving_timeout_ms": serving.max_queue_delay_us / 1e3 if serving else None,
            "warmed_buckets": None,
            "model": self.model,
            "reloads": len(timed),
            "last_reload_s": round(timed[-1], 3) if timed else None,
            "max_reload_s": round(max(timed), 3) if timed else None,
            "rejected_loads": self.counts.rejected,
            "restarts_detected": self.counts.restarts_detected,
            "approximate_windows": self.counts.approximate_windows,
        }

    # -- Triton ----------------------------------------------------------------

    async def _put_in_force(self, target: Knobs, config: BatchConfig) -> None:
        current = await self._read_config()
        serving = Knobs.read(current)
        self._serving = serving
        if serving == target:
            return  # already in force (a warm target changed, or a re-sent version)
        started = self.clock.now()
        self._loaded_since_snapshot = True  # accepted or not, Triton loaded an instance
        try:
            await self._grpc().load_model(
                self.model,
                config=json.dumps(override_config(current, config)),
                client_timeout=LOAD_TIMEOUT_S,
            )
        except InferenceServerException as error:
            if _is_rejection(error):
                self.counts.rejected += 1
                self._serving = Knobs.read(await self._read_config())
                raise ConfigRejected(
                    f"Triton refused {target.describe()}: {rejection_reason(error)} "
                    f"(serving {self._serving.describe()})"
                ) from None
            raise TritonUnreachable(f"load_model {self.model!r}: {error}") from error
        took_s = self.clock.now() - started
        self._serving = Knobs.read(await self._read_config())
        if self._serving != target:
            raise ConfigRejected(
                f"Triton loaded the override but serves {self._serving.describe()}, "
                f"not {target.describe()}"
            )
        self.counts.reloads_s.append(took_s)
        log.info("triton %s serves %s (reload %.2f s)", self.model, target.describe(), took_s)

    async def _watch_loop(self) -> None:
        """Read back what Triton serves; a restarted Triton serves its disk config, so
        this engine's config is loaded again. The read is made under the lock, so a
        change cannot land between the read and the comparison with what was applied
        (a read from before a change, compared after it, looked like a restart)."""
        while True:
            await asyncio.sleep(self.watch_interval_s)
            if self._lock.locked():
                continue  # a change is under way: its own read-back decides
            async with self._lock:
                await self._check_served()

    async def _check_served(self) -> None:
        """Under the lock: what Triton serves, and this engine's config again if that
        is not it."""
        try:
            serving = Knobs.read(await self._read_config())
        except TritonUnreachable:
            return  # collect() reports the outage; try again next round
        self._serving = serving
        if self._applied is None or serving == self._applied:
            return
        self.counts.restarts_detected += 1
        log.warning(
            "triton %s serves %s, not %s (restarted?): loading config v%d again",
            self.model,
            serving.describe(),
            self._applied.describe(),
            self._version,
        )
        applied = self._applied
        config = BatchConfig(applied.max_batch_size, applied.max_queue_delay_us / 1e6)
        try:
            await self._put_in_force(applied, config)
        except (ConfigRejected, TritonUnreachable) as error:
            log.warning(
                "triton %s: loading config v%d again failed: %s", self.model, self._version, error
            )
            return
        self.counts.reapplied += 1

    def _grpc(self) -> InferenceServerClient:
        assert self._client is not None, "start() first"
        return self._client

    async def _read_config(self) -> dict[str, Any]:
        try:
            answer = await self._grpc().get_model_config(
                self.model, as_json=True, client_timeout=READ_TIMEOUT_S
            )
        except InferenceServerException as error:
            raise TritonUnreachable(f"get_model_config {self.model!r}: {error}") from error
        return answer["config"]

    async def _snapshot(self) -> Snapshot:
        assert self._http is not None, "start() first"
        metrics, statistics = await asyncio.gather(
            self._http.get(self.metrics_url),
            self._grpc().get_inference_statistics(
                self.model, as_json=True, client_timeout=READ_TIMEOUT_S
            ),
            return_exceptions=True,
        )
        if isinstance(metrics, BaseException) or metrics.status_code != 200:
            what = metrics if isinstance(metrics, BaseException) else metrics.status_code
            raise TritonUnreachable(f"GET {self.metrics_url}: {what!r}")  # the member logs it
        batches = None
        if not isinstance(statistics, BaseException):
            batches = parse_batch_stats(statistics, self.model)
        return Snapshot(parse_metrics(metrics.text, self.model), batches)
