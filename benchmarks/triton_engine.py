"""Triton, live: a compressed promotion day through one Triton model, predictive against
static configs, every one of them put in force by `tidal engine triton`.

One tritonserver (the nvidia-pytriton wheel's, on CPU) serves examples/triton/models
(`tidal_sleep`: each execution sleeps 10 ms + 1 ms per item, plus the python backend's
own overhead). First a short calibration at a steady rate fits the planner's latency
model (linear: base + per item) to the execution times Triton's statistics API reports
per batch size, its base raised by the time a request spends outside Triton's queue and
model (gRPC, the backend's hand-offs). Then, for each policy, a `tidal controller`
(with `--reload 3s`, the day's flash sales declared) and a `tidal engine triton` join a
pool of their own, and the day (`examples/promo_day.csv`, compressed into `--seconds`)
is replayed over gRPC, open loop. The statics: the model's own config (its config.pbtxt:
max_batch=8, timeout=5ms) and a small sweep; the best static is the sweep's (model's own included)
highest SLO attainment, then fewest busy seconds per 1,000 requests.

Figures per policy: client-side p50/p99, SLO attainment (answered within the SLO, over
all requests sent), failed requests, busy seconds per 1,000 requests (the engine's
windows: Triton's execution times), mean batch size (Triton's counters), config changes
and the reloads the engine timed.

    PYTHONPATH=. python benchmarks/triton_engine.py [--seconds 50] [--peak-rps 400]

The day is compressed about 1,700x: a flash sale lasts a second or two, a 3 s reload is
an hour and a half of the day, so the controller runs with `--guard dwell=2s`.

Prints a table; the last line is one JSON object with every figure. The machine's two
cores run Triton, its python-backend stub, the controller, the engine and the load
generator together: figures are noisy, and compare the policies on this machine only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import redis
import tritonclient.grpc as triton_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from compressed_day import day_arrivals, write_day_events
from redis_server import RedisProcess, free_port

from server.bus.wire import decode_stats
from server.engines.triton import parse_batch_stats, parse_metrics
from server.engines.triton_local import TritonProcess, replay, steady_arrivals

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "triton" / "models"
MODEL = "tidal_sleep"
OWN = "static:max_batch=8,timeout=5ms"  # examples/triton/models/tidal_sleep/config.pbtxt
SWEEP = ("static:max_batch=4,timeout=2ms", "static:max_batch=32,timeout=20ms")
PREDICTIVE = "predictive"
RELOAD = "3s"
# The day is compressed ~1,700x: the default 60 s dwell would be a day and more of it.
# 2 s (about an hour of the day) lets a policy come down after a sale.
GUARD = "dwell=2s"


def tidal(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "server.cli", *argv],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = condition()
        except httpx.HTTPError:
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def scrape(triton: TritonProcess):
    return parse_metrics(httpx.get(triton.metrics_url, timeout=5).text, MODEL)


def calibrate(triton: TritonProcess, rate_rps: float, seconds: float) -> tuple[float, float]:
    """Base and per-item milliseconds of a batch as a client sees it: a line fitted to
    the execution times per batch size (Triton's statistics API), its base raised by
    the time a request spends outside Triton's queue and model (gRPC, the python
    backend's hand-offs), which the planner's latency model would otherwise not know."""
    client = triton_grpc.InferenceServerClient(triton.grpc_url)
    before = parse_batch_stats(client.get_inference_statistics(MODEL, as_json=True), MODEL)
    counters_before = scrape(triton)
    outcomes = asyncio.run(
        replay(triton.grpc_url, MODEL, steady_arrivals(rate_rps, seconds, seed=9))
    )
    counters_after = scrape(triton)
    after = parse_batch_stats(client.get_inference_statistics(MODEL, as_json=True), MODEL)
    client.close()
    old = {s: (n, ns) for s, n, ns in before.sizes}
    sizes, means, weights = [], [], []
    for size, n, ns in after.sizes:
        n0, ns0 = old.get(size, (0, 0))
        if n - n0 > 0:
            sizes.append(size)
            means.append((ns - ns0) / (n - n0) / 1e6)
            weights.append(n - n0)
    if len(sizes) < 2:
        base, per_item = (means[0] if means else 12.0), 1.0
    else:
        per_item, base = np.polyfit(sizes, means, 1, w=np.sqrt(weights))
    served = max(counters_after.success - counters_before.success, 1)
    inside_ms = (
        sum(
            getattr(counters_after, f) - getattr(counters_before, f)
            for f in ("queue_us", "input_us", "infer_us", "output_us")
        )
        / served
        / 1e3
    )
    client_ms = float(np.mean([o.latency_s for o in outcomes if o.error is None])) * 1e3
    overhead_ms = max(0.0, client_ms - inside_ms)
    return max(float(base), 0.1) + overhead_ms, max(float(per_item), 0.01)


def run_policy(
    policy: str,
    index: int,
    args: argparse.Namespace,
    triton: TritonProcess,
    redis_url: str,
    latency_model: str,
    work: Path,
) -> dict:
    pool = f"triton{index}"
    arrivals, time_scale = day_arrivals(args.seconds, args.peak_rps)
    start_at = time.time() + 15.0  # the controller compiles its table meanwhile
    events_path = work / f"events-{index}.json"
    write_day_events(events_path, time_scale, start_at)
    port = free_port()
    api = f"http://127.0.0.1:{port}"
    name = policy.split(":")[0] + str(index)
    controller = tidal(
        [
            "controller", "--redis", redis_url, "--pool", pool, "--policy", policy,
            "--slo", f"{args.slo_ms}ms", "--workers", "1", "--latency-model", latency_model,
            "--reload", RELOAD, "--events", str(events_path), "--port", str(port),
            "--tick", "0.5s", "--lease", "1s", "--name", name, "--guard", GUARD,
        ],
        work / f"controller-{name}.log",
    )  # fmt: skip
    engine = tidal(
        [
            "engine", "triton", "--redis", redis_url, "--pool", pool,
            "--grpc", triton.grpc_url, "--metrics", triton.metrics_url, "--model", MODEL,
            "--name", f"triton-{name}",
        ],
        work / f"engine-{name}.log",
    )  # fmt: skip
    try:
        wait_for(lambda: httpx.get(f"{api}/readyz").status_code == 200, 60, "the controller")
        wait_for(
            lambda: httpx.get(f"{api}/v1/pools/{pool}").json()["engines"] == {"triton": 1},
            30,
            "the engine",
        )
        first = httpx.get(f"{api}/v1/pools/{pool}").json()["version"]
        wait_for(lambda: heartbeat(redis_url, pool, name)["config_version"] >= first, 30, "v1")
        before = scrape(triton)
        time.sleep(max(0.0, start_at - time.time()))
        outcomes = asyncio.run(replay(triton.grpc_url, MODEL, arrivals))
        time.sleep(1.5)  # the last window reaches the pool
        after = scrape(triton)
        summary = httpx.get(f"{api}/v1/pools/{pool}", timeout=5).json()
        beat = heartbeat(redis_url, pool, name)
    finally:
        for process in (engine, controller):
            process.send_signal(signal.SIGTERM)
        for process in (engine, controller):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    busy_s, completed = pool_busy(redis_url, pool)
    return figures(policy, outcomes, args.slo_ms / 1e3, before, after, busy_s, completed) | {
        "config_changes": summary["config_changes"],
        "reloads": beat["reloads"],
        "mean_reload_s": beat["change_cost"]["reload_s"] if beat["reloads"] else None,
        "max_reload_s": beat["max_reload_s"],
        "approximate_windows": beat["approximate_windows"],
    }


def heartbeat(redis_url: str, pool: str, name: str) -> dict:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        text = client.get(f"tidal:{pool}:worker:triton-{name}")
    finally:
        client.close()
    return json.loads(text) if text else {"config_version": -1}


def pool_busy(redis_url: str, pool: str) -> tuple[float, int]:
    """Busy seconds and completions over every window the engine sent the pool."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        entries = client.xrange(f"tidal:{pool}:stats")
    finally:
        client.close()
    reports = [decode_stats(fields["stats"]) for _, fields in entries if "stats" in fields]
    return sum(r.busy_s for r in reports), sum(r.completed for r in reports)


def figures(policy, outcomes, slo_s, before, after, busy_s, completed) -> dict:
    latencies = np.array([o.latency_s for o in outcomes if o.error is None])
    executions = after.executions - before.executions
    items = after.inferences - before.inferences
    return {
        "policy": policy,
        "requests": len(outcomes),
        "ok": int(latencies.size),
        "failed": len(outcomes) - int(latencies.size),
        "p50_ms": round(float(np.quantile(latencies, 0.5)) * 1e3, 2),
        "p99_ms": round(float(np.quantile(latencies, 0.99)) * 1e3, 2),
        "slo_attainment": round(float((latencies <= slo_s).sum()) / max(len(outcomes), 1), 5),
        "busy_s": round(busy_s, 3),
        "busy_seconds_per_1k": round(busy_s / max(completed, 1) * 1e3, 4),
        "mean_batch_size": round(items / max(executions, 1), 3),
    }


def table(rows: list[dict]) -> str:
    header = (
        f"{'policy':34} {'requests':>8} {'failed':>6} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'SLO %':>7} {'busy/1k':>8} {'batch':>6} {'changes':>7} {'reload s':>9}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        reload = f"{r['mean_reload_s']:.2f}" if r["mean_reload_s"] else "-"
        lines.append(
            f"{r['policy']:34} {r['requests']:>8} {r['failed']:>6} {r['p50_ms']:>7.1f} "
            f"{r['p99_ms']:>7.1f} {r['slo_attainment'] * 100:>7.2f} "
            f"{r['busy_seconds_per_1k']:>8.3f} {r['mean_batch_size']:>6.2f} "
            f"{r['config_changes']:>7} {reload:>9}"
        )
    return "\n".join(lines)


def best_static(rows: list[dict]) -> dict:
    statics = [r for r in rows if r["policy"].startswith("static")]
    return max(statics, key=lambda r: (r["slo_attainment"], -r["busy_seconds_per_1k"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=50.0, help="the day replayed in")
    parser.add_argument("--peak-rps", type=float, default=400.0, help="replayed peak rate")
    parser.add_argument("--slo-ms", type=float, default=100.0, help="p99 SLO (default 100)")
    parser.add_argument("--policy", action="append", help="policies (default: 4)")
    args = parser.parse_args()
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="tidal-triton-bench-"))
    shutil.copytree(MODELS, work / "models")
    server = RedisProcess()
    server.start()
    triton = TritonProcess(work / "models", [MODEL], log_path=work / "tritonserver.log")
    try:
        triton.start()
        base_ms, per_item_ms = calibrate(triton, rate_rps=args.peak_rps / 2, seconds=6.0)
        latency_model = f"linear:{base_ms:.2f},{per_item_ms:.3f}"
        policies = args.policy or [PREDICTIVE, OWN, *SWEEP]
        rows = [
            run_policy(p, i, args, triton, server.url, latency_model, work)
            for i, p in enumerate(policies)
        ]
    finally:
        with contextlib.ExitStack() as cleanup:  # each runs even if the other fails
            cleanup.callback(server.stop)
            cleanup.callback(triton.close)
    print(table(rows))
    by_policy = {r["policy"]: r for r in rows}
    comparisons = {}
    if PREDICTIVE in by_policy and any(p.startswith("static") for p in by_policy):
        best = best_static(rows)
        for label, other in (("own", by_policy.get(OWN)), ("best_static", best)):
            if other is None:
                continue
            ours = by_policy[PREDICTIVE]
            comparisons[f"predictive_vs_{label}"] = ratio = {
                "against": other["policy"],
                "p99": round(ours["p99_ms"] / other["p99_ms"], 3),
                "busy_per_1k": round(ours["busy_seconds_per_1k"] / other["busy_seconds_per_1k"], 3),
                "slo_attainment_points": round(
                    (ours["slo_attainment"] - other["slo_attainment"]) * 100, 2
                ),
            }
            print(
                f"predictive vs {label} ({other['policy']}): p99 x{ratio['p99']}, "
                f"busy/1k x{ratio['busy_per_1k']}, SLO {ratio['slo_attainment_points']:+} points"
            )
    print(
        json.dumps(
            {
                "seconds": args.seconds,
                "peak_rps": args.peak_rps,
                "slo_ms": args.slo_ms,
                "latency_model": latency_model,
                "triton_start_s": round(triton.started_in_s or 0.0, 2),
                "results": rows,
                "comparisons": comparisons,
                "wall_s": round(time.perf_counter() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
