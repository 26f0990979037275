"""`tidal profile --under-load URL`: a latency profile measured while a worker serves.

A profile taken with the model alone on the machine misses what serving costs: the HTTP
layer, the load generator and the model share the cores, so batches run slower and more
variably than profiled (docs/benchmarks.md measured p99 69% above the profile's). This
mode replays open-loop Poisson load at each of `--rates` against a running `tidal
worker` (its own config decides the batches) and reads every answer's timing: the padded
size that ran and its execution time. Requests of one batch share both, so a run of n
equal answers from a batch of n counts once. Sizes with at least `--runs` batches become
the profile's points (mean and p99 over batches), in the JSON `simulate --latency-model`
and the controller load.

The same answers say what a client waits outside the batcher: its latency minus the
worker's queue wait and execution (the socket's and event loop's queue, reading and
decoding the body, the answer's way back). It grows with the load (the HTTP layer
queues too), so the profile carries its distribution per rate, as
`request_overhead_ms`: one entry per rate with quantiles at `levels`, which the
simulator adds to its batcher's account to predict what clients see and the planner
charges against the SLO (`adaptive.overhead`).

Several workers (`URL,URL`) take the load in turn, as a pool's balancer gives it: the
rates are the pool's, and each entry's `rate_rps` is what one worker was offered (the
rate over the workers), the unit the simulator and the planner read it in. A pool whose
workers share a machine shows its contention this way; one worker alone does not.
"""

from __future__ import annotations

import collections

import httpx
import numpy as np
import uvloop

from server.tools.loadgen import RequestResult, collector_paused, encode_payloads, replay
from server.worker.models import ServedModel
from tidal_base.errors import InvalidInput


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidInput(f"--rates: expected req/s separated by commas, got {text!r}") from None
    if not rates or any(not (0 < r < 1e5) for r in rates):
        raise InvalidInput(f"--rates: each rate must be in (0, 100000) req/s, got {text!r}")
    return rates


def parse_urls(text: str) -> list[str]:
    """`--under-load URL[,URL...]`: the workers that share the load."""
    urls = [part.strip().rstrip("/") for part in text.split(",") if part.strip()]
    if not urls:
        raise InvalidInput(
            f"--under-load: expected a worker URL (or several, comma-separated), got {text!r}"
        )
    return urls


def check_worker(url: str) -> None:
    """Fail in the first second, naming the URL, when no worker answers there."""
    try:
        response = httpx.get(f"{url.rstrip('/')}/healthz", timeout=5.0)
    except httpx.HTTPError as error:
        raise InvalidInput(f"--under-load {url}: no worker answers ({error})") from None
    if response.status_code != 200:
        raise InvalidInput(f"--under-load {url}: /healthz answered {response.status_code}")


def poisson_times(rates: list[float], seconds: float, seed: int) -> np.ndarray:
    """Arrival times (s from now) of `seconds` at each rate in turn."""
    rng = np.random.default_rng(seed)
    parts = []
    for i, rate in enumerate(rates):
        gaps = rng.exponential(1.0 / rate, size=int(rate * seconds * 1.5) + 10)
        times = np.cumsum(gaps)
        parts.append(i * seconds + times[times < seconds])
    return np.concatenate(parts)


def batches_by_size(results: list[RequestResult]) -> dict[int, list[float]]:
    """Execution seconds per batch, by padded size, from per-request answers."""
    answers = collections.Counter(
        (r.padded_size, r.batch_size, r.execution_ms)
        for r in results
        if r.status == 200 and r.padded_size and r.batch_size and r.execution_ms is not None
    )
    by_size: dict[int, list[float]] = collections.defaultdict(list)
    for (padded, size, execution_ms), count in answers.items():
        # n answers of one batch of n; two batches with the same time to the microsecond
        # give 2n, hence the rounding.
        by_size[padded].extend([execution_ms / 1e3] * max(1, round(count / size)))
    return dict(by_size)


OVERHEAD_LEVELS = (
    *(i / 20 for i in range(19)),  # 0% to 90% in steps of 5%
    *(0.90 + i / 100 for i in range(1, 10)),  # 91% to 99%: the tail is what matters
    0.995,
    0.999,
    1.0,
)
"""The quantiles of the request overhead a profile keeps."""


def overhead_quantiles(
    results: list[RequestResult], rates: list[float], seconds: float, workers: int = 1
) -> list[dict]:
    """Per rate: client latency minus the worker's queue wait and execution, in ms; each
    entry at the rate one of `workers` was offered."""
    by_rate: list[list[float]] = [[] for _ in rates]
    for r in results:
        if r.status == 200 and r.queue_wait_ms is not None and r.execution_ms is not None:
            index = min(int(r.scheduled_s // seconds), len(rates) - 1)
            by_rate[index].append(r.latency_s * 1e3 - r.queue_wait_ms - r.execution_ms)
    entries = []
    for rate, samples in zip(rates, by_rate, strict=True):
        if not samples:
            continue
        overhead = np.maximum(np.array(samples), 0.0)
        entries.append(
            {
                "rate_rps": round(rate / workers, 4),
                "requests": len(samples),
                "levels": [round(level, 4) for level in OVERHEAD_LEVELS],
                "quantiles": [round(float(v), 4) for v in np.quantile(overhead, OVERHEAD_LEVELS)],
                "p50": round(float(np.quantile(overhead, 0.5)), 4),
                "p99": round(float(np.quantile(overhead, 0.99)), 4),
            }
        )
    return entries


def profile_under_load(
    urls: list[str],
    model: ServedModel,
    rates: list[float],
    seconds: float,
    min_batches: int,
    seed: int = 0,
) -> tuple[dict, list[RequestResult]]:
    """The profile document and the answers it was read from: `rates` offered to the
    `urls` together, in turn."""
    payloads, content_type = encode_payloads(model, "binary")
    times = poisson_times(rates, seconds, seed)
    with collector_paused():
        results = uvloop.run(replay(urls, times, payloads, 2000, content_type))
    where = ", ".join(urls)
    failed = sum(r.status != 200 for r in results)
    by_size = batches_by_size(results)
    points = [
        {
            "batch_size": size,
            "mean_ms": round(float(np.mean(samples)) * 1e3, 4),
            "p99_ms": round(float(np.quantile(samples, 0.99)) * 1e3, 4),
            "batches": len(samples),
        }
        for size, samples in sorted(by_size.items())
        if len(samples) >= min_batches
    ]
    if not points:
        seen = {size: len(samples) for size, samples in sorted(by_size.items())}
        raise InvalidInput(
            f"under load at {where}: no batch size ran {min_batches} times (batches per "
            f"padded size: {seen}; {failed} of {len(results)} requests failed): raise "
            "--seconds or lower --runs"
        )
    document = {
        "model": model.name,
        "request_overhead_ms": overhead_quantiles(results, rates, seconds, len(urls)),
        "measured": f"under load at {where}: {', '.join(f'{r:g}' for r in rates)} req/s, "
        f"{seconds:g} s each",
        "workers": len(urls),
        "requests": len(results),
        "failed": failed,
        "points": points,
    }
    return document, results
