"""`tidal loadgen`: replay a trace against a worker, open loop.

    tidal loadgen --trace examples/promo_day.csv --target http://127.0.0.1:8001 \\
                  --time-scale 100 --duration 60s --out results.csv

Requests leave at the trace's arrival times whatever the latency (open loop: a slow
server does not slow the offered load), bounded by `--max-in-flight` (past it a request
is counted as not sent, never queued in the client) and by `--duration`. Payloads are the
model's seeded example inputs, encoded once. Prints the achieved rate, latency
percentiles and errors by status; `--out` writes one row per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import gc
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import astuple, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from server.tools.lean_http import Endpoint, PostRequest
from tidal_base.errors import InvalidInput
from tidal_base.units import parse_duration_s

if TYPE_CHECKING:  # numpy, pandas and torch load when a replay runs, not for --help
    import numpy as np

PAYLOADS = 64


@dataclass(frozen=True, slots=True)
class RequestResult:
    scheduled_s: float
    sent_s: float
    status: int  # 0: not sent (in-flight bound), -1: connection error
    latency_s: float
    queue_wait_ms: float | None
    batch_size: int | None
    execution_ms: float | None = None
    ingress_ms: float | None = None  # the worker's socket to its batcher (its account)
    padded_size: int | None = None  # the batch size that ran on the device


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    loadgen = subparsers.add_parser("loadgen", help="replay a trace against a worker (open loop)")
    loadgen.add_argument(
        "--trace",
        required=True,
        type=Path,
        help="CSV trace to replay, request- or count-level (see docs/traces.md)",
    )
    loadgen.add_argument(
        "--target",
        required=True,
        help="worker base URL, e.g. http://127.0.0.1:8001; several, comma-separated, "
        "take requests in turn (a round-robin balancer)",
    )
    loadgen.add_argument(
        "--model",
        default="demo-cnn",
        help="the model whose seeded example inputs are sent: demo-cnn, demo-ranker, demo-text, a "
        "TorchScript file or module:factory, as the worker's --model (default demo-cnn)",
    )
    loadgen.add_argument("--time-scale", type=float, default=1.0, help="replay K times faster")
    loadgen.add_argument("--rate-scale", type=float, default=1.0, help="K times the load")
    loadgen.add_argument("--duration", help="stop after this much replay time, e.g. 60s")
    loadgen.add_argument(
        "--max-in-flight",
        type=int,
        default=1000,
        help="requests awaiting an answer at most; an arrival past it is counted as not "
        "sent (status 0), never queued in the client (default 1000)",
    )
    loadgen.add_argument(
        "--seed", type=int, default=0, help="seed of the arrival times (default 0)"
    )
    loadgen.add_argument(
        "--start-at", type=float, help="Unix time to start the replay at (aligns with events)"
    )
    loadgen.add_argument(
        "--encoding",
        choices=["binary", "json"],
        default="binary",
        help="request bodies (default binary)",
    )
    loadgen.add_argument(
        "--max-failed",
        type=float,
        default=0.01,
        help="exit 1 when more than this fraction of requests did not answer 200 (not "
        "sent, connection errors, 429, 5xx...); default 0.01, 1 never fails",
    )
    loadgen.add_argument("--out", type=Path, help="per-request CSV")
    loadgen.add_argument("--json", action="store_true", help="print only the summary JSON")
    loadgen.set_defaults(handler=run_loadgen)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a replay runs in this process, and what was
    built before it (torch, the model, the arrivals) frozen out of the collector's way.
    A full collection walked that heap, and the results as they grew, for 50-90 ms at a
    time in the middle of a replay (docs/benchmarks.md): every answer in flight then read
    late. A replay's own garbage is freed by reference counting; whatever cycles it left
    are collected once it ends."""
    gc.freeze()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


def parse_targets(text: str) -> list[str]:
    """`--target URL[,URL...]`: each an http://host:port base URL."""
    targets = [t.strip().rstrip("/") for t in text.split(",") if t.strip()]
    if not targets:
        raise InvalidInput(f"--target: expected a worker URL, got {text!r}")
    for target in targets:
        try:
            PostRequest(f"{target}/v1/infer", [b""], "application/octet-stream")
        except ValueError:
            raise InvalidInput(
                f"--target: expected http://host:port (several comma-separated), got {target!r}"
            ) from None
    return targets


def arrival_times(
    trace_path: Path, time_scale: float, rate_scale: float, duration_s: float | None, seed: int
) -> np.ndarray:
    import numpy as np

    from simulations.traces import load_trace

    trace = load_trace(trace_path, time_scale=time_scale, rate_scale=rate_scale)
    rng = np.random.default_rng(seed)
    parts = []
    for end_s, arrivals in trace.arrival_chunks(60.0, rng):
        parts.append(arrivals)
        if duration_s is not None and end_s >= duration_s:
            break
    times = np.concatenate(parts) if parts else np.zeros(0)
    return times[times < duration_s] if duration_s is not None else times


SCHEDULE_AHEAD_S = 0.5
"""Arrivals are handed to the event loop's timers this far ahead, a window at a time:
one timer an arrival, no task or coroutine, and a long trace is never all in memory."""


async def replay(
    target: str | Sequence[str],
    times: np.ndarray,
    payloads: list[bytes],
    max_in_flight: int,
    content_type: str = "application/json",
    timeout_s: float = 60.0,
) -> list[RequestResult]:
    """Send one request per arrival time (seconds from now), to the targets in turn;
    returns one result each, in arrival order. Requests go over `server.tools.lean_http`
    (a fifth or less of httpx's CPU a request), so the client takes little of the cores it
    shares with the workers it measures."""
    targets = [target] if isinstance(target, str) else list(target)
    urls = [f"{t.rstrip('/')}/v1/infer" for t in targets]
    # Stamped so the worker can measure its HTTP layer's queue (ingress_ms).
    requests = [PostRequest(u, payloads, content_type, stamp_sent_at=True) for u in urls]
    endpoints = [Endpoint(r.host, r.port) for r in requests]
    return await _Replay(requests, endpoints, times, max_in_flight, timeout_s).run()


class _Replay:
    """One replay's state on its event loop: what is in flight and the results so far."""

    def __init__(
        self,
        requests: list[PostRequest],
        endpoints: list[Endpoint],
        times: np.ndarray,
        max_in_flight: int,
        timeout_s: float,
    ) -> None:
        self.requests, self.endpoints = requests, endpoints
        self.times = [float(t) for t in times]
        self.max_in_flight, self.timeout_s = max_in_flight, timeout_s
        self.results: list[RequestResult | None] = [None] * len(self.times)
        self.in_flight = 0
        self.remaining = len(self.times)
        self.finished: asyncio.Future[None] | None = None
        self.started = 0.0
        self.stopped = False

    async def run(self) -> list[RequestResult]:
        loop = asyncio.get_running_loop()
        self.finished = loop.create_future()
        if not self.times:
            return []
        self.started = time.perf_counter()
        zero = loop.time()
        try:
            scheduled = 0
            while scheduled < len(self.times):
                horizon = loop.time() - zero + SCHEDULE_AHEAD_S
                while scheduled < len(self.times) and self.times[scheduled] < horizon:
                    loop.call_at(zero + self.times[scheduled], self._arrive, scheduled)
                    scheduled += 1
                await asyncio.sleep(SCHEDULE_AHEAD_S / 2)
            await self.finished
        finally:
            self.stopped = True  # a cancelled replay sends nothing more
            for endpoint in self.endpoints:
                endpoint.close()
        return [r for r in self.results if r is not None]

    def _arrive(self, i: int) -> None:
        if self.stopped:
            return
        scheduled = self.times[i]
        sent = time.perf_counter() - self.started
        if self.in_flight >= self.max_in_flight:
            self._record(i, RequestResult(scheduled, sent, 0, 0.0, None, None))
            return
        self.in_flight += 1
        which = i % len(self.requests)
        data = self.requests[which].encode(i)

        def answered(status: int, body: bytes) -> None:
            latency = time.perf_counter() - self.started - sent
            self.in_flight -= 1
            self._record(i, _result(scheduled, sent, status, latency, body))

        self.endpoints[which].post(data, answered, self.timeout_s)

    def _record(self, i: int, result: RequestResult) -> None:
        self.results[i] = result
        self.remaining -= 1
        if self.remaining == 0 and self.finished is not None and not self.finished.done():
            self.finished.set_result(None)


def _result(scheduled: float, sent: float, status: int, latency: float, body: bytes):
    timing = {}
    if status == 200:
        try:
            timing = json.loads(body).get("timing", {})
        except (ValueError, AttributeError):  # not a worker's answer: no timing
            timing = {}
    return RequestResult(
        scheduled,
        sent,
        status,
        latency,
        timing.get("queue_wait_ms"),
        timing.get("batch_size"),
        timing.get("execution_ms"),
        timing.get("ingress_ms"),
        timing.get("padded_size"),
    )


def encode_payloads(model, encoding: str) -> tuple[list[bytes], str]:
    """The model's seeded example inputs, encoded once (binary when the model has it)."""
    if encoding == "binary" and model.to_bytes is not None:
        return [
            model.to_bytes(model.example(i)) for i in range(PAYLOADS)
        ], "application/octet-stream"
    return [
        json.dumps({"input": model.example(i)}).encode() for i in range(PAYLOADS)
    ], "application/json"


def summarise(results: list[RequestResult], span_s: float) -> dict:
    import numpy as np

    statuses: dict[str, int] = {}
    for r in results:
        statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1
    ok = np.array([r.latency_s for r in results if r.status == 200])
    sizes = [r.batch_size for r in results if r.batch_size]
    lag = np.array([r.sent_s - r.scheduled_s for r in results if r.status != 0])
    ingress = np.array([r.ingress_ms for r in results if r.ingress_ms is not None])
    quantile = (
        (lambda q: round(float(np.quantile(ok, q)) * 1e3, 3)) if ok.size else (lambda q: None)
    )
    return {
        "requests": len(results),
        "ok": int(ok.size),
        "offered_rps": round(len(results) / span_s, 2) if span_s else 0.0,
        "achieved_rps": round(ok.size / span_s, 2) if span_s else 0.0,
        "latency_ms": {
            "p50": quantile(0.5),
            "p90": quantile(0.9),
            "p99": quantile(0.99),
            "max": quantile(1.0),
        },
        "mean_batch_size": round(float(np.mean(sizes)), 3) if sizes else None,
        "send_lag_p99_ms": round(float(np.quantile(lag, 0.99)) * 1e3, 3) if lag.size else None,
        # The worker's own account of its HTTP layer's queue (socket to batcher).
        "ingress_ms": {
            "p50": round(float(np.quantile(ingress, 0.5)), 3),
            "p99": round(float(np.quantile(ingress, 0.99)), 3),
        }
        if ingress.size
        else None,
        "by_status": statuses,
    }


def run_loadgen(args: argparse.Namespace) -> int:
    duration_s = parse_duration_s(args.duration, field="--duration") if args.duration else None
    if args.max_in_flight < 1:
        raise InvalidInput(f"--max-in-flight must be >= 1, got {args.max_in_flight}")
    if not 0 <= args.max_failed <= 1:
        raise InvalidInput(f"--max-failed must be a fraction in [0, 1], got {args.max_failed}")
    targets = parse_targets(args.target)
    times = arrival_times(args.trace, args.time_scale, args.rate_scale, duration_s, args.seed)
    if not times.size:
        raise InvalidInput(f"{args.trace}: no arrivals to replay in the chosen span")
    import uvloop

    from server.worker.models import load_model  # torch

    model = load_model(args.model)
    payloads, content_type = encode_payloads(model, args.encoding)
    if args.start_at is not None:
        time.sleep(max(0.0, args.start_at - time.time()))
    # uvloop: about a sixth less CPU a request than asyncio's own loop (docs/benchmarks.md).
    with collector_paused():
        results = uvloop.run(replay(targets, times, payloads, args.max_in_flight, content_type))
    span_s = float(times[-1]) if times.size > 1 else 1.0
    summary = {"target": args.target, "trace": str(args.trace), **summarise(results, span_s)}
    if args.out is not None:
        _write_results(args.out, results)
    print(json.dumps(summary) if args.json else _format(summary))
    failed = summary["requests"] - summary["ok"]
    if failed > args.max_failed * summary["requests"]:
        print(
            f"tidal loadgen: error: {failed:,} of {summary['requests']:,} requests failed "
            f"(by status: {', '.join(f'{k}: {n:,}' for k, n in summary['by_status'].items())}), "
            f"more than --max-failed {args.max_failed:g}",
            file=sys.stderr,
        )
        return 1
    return 0


def _format(summary: dict) -> str:
    lat = summary["latency_ms"]
    ingress = summary["ingress_ms"]
    ingress_text = f"p50 {ingress['p50']} p99 {ingress['p99']}" if ingress else "not reported"
    statuses = ", ".join(f"{status}: {n:,}" for status, n in summary["by_status"].items())
    return (
        f"{summary['requests']:,} requests: offered {summary['offered_rps']:,.1f} req/s, "
        f"achieved {summary['achieved_rps']:,.1f} req/s\n"
        f"latency ms p50 {lat['p50']} p90 {lat['p90']} p99 {lat['p99']} max {lat['max']}; "
        f"mean batch {summary['mean_batch_size']}; send lag p99 {summary['send_lag_p99_ms']} ms"
        f"; worker ingress ms {ingress_text}\n"
        f"by status: {statuses} (0: not sent, over --max-in-flight; -1: connection error)"
    )


def _write_results(path: Path, results: list[RequestResult]) -> None:
    try:
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow([f.name for f in fields(RequestResult)])
            writer.writerows(astuple(r) for r in results)
    except OSError as error:
        raise InvalidInput(f"{path}: cannot write ({error.strerror})") from None
