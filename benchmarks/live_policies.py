"""Live: the same compressed promotion day through real workers, predictive vs static.

For each policy, one `tidal controller --redis none` hosting two `demo-cnn` workers
(the planner's latency model is a `tidal profile` of the model, taken first), and
`tidal loadgen` replaying `examples/promo_day.csv` time-compressed with its flash sales
declared. Reported side by side: client-side p50/p99, SLO attainment (answered within
the SLO, over all requests sent), the workers' busy seconds per 1,000 requests (the
model's compute, what batching saves), mean batch size and config changes.

    PYTHONPATH=. python benchmarks/live_policies.py [--seconds 120] [--peak-rps 120]

Prints a table; the last line is one JSON object with every figure. The machine's two
cores run the workers, the controller and the load generator together, so this measures
the policies under CPU contention, as the docs say.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from forecaster.events import event_to_dict, load_events, rescale_events
from forecaster.series import epoch_seconds
from server.tools.demo import run_tidal, start_tidal, wait_ready
from simulations.traces import load_trace

TRACE = Path("examples/promo_day.csv")
EVENTS = Path("examples/promo_day.events.yaml")
POLICIES = (
    "predictive",
    "static:max_batch=4,timeout=2ms",
    "static:max_batch=32,timeout=20ms",
)
SLO_S = 0.1
PORT = 18700


def run_policy(policy: str, args: argparse.Namespace, work: Path) -> dict:
    trace = load_trace(TRACE)
    time_scale = 86_400 / args.seconds
    rate_scale = args.peak_rps / (float(trace.counts.max() / trace.step_s) * time_scale)
    start_at = time.time() + 30.0  # the controller compiles its table and warms meanwhile
    events = rescale_events(load_events(EVENTS), epoch_seconds(trace.origin), time_scale, start_at)
    events_path = work / "events.json"
    events_path.write_text(json.dumps({"events": [event_to_dict(e) for e in events]}))
    api = f"http://127.0.0.1:{PORT}"
    workers = [f"http://127.0.0.1:{PORT + i}" for i in (1, 2)]
    log = work / f"controller-{policy.split(':')[0]}.log"
    controller = start_tidal(
        [
            "controller", "--redis", "none", "--pool", "live", "--policy", policy,
            "--slo", f"{SLO_S}s", "--workers", "2", "--latency-model", str(work / "profile.json"),
            "--events", str(events_path), "--port", str(PORT), "--local-workers", "2",
            "--worker-port", str(PORT + 1), "--latency-drift", repr(args.latency_drift),
        ],
        log.open("w"),
    )  # fmt: skip
    try:
        wait_ready(api, controller, log)
        requests_csv = work / "requests.csv"
        replay = subprocess.run(
            [
                sys.executable, "-m", "server.cli", "loadgen", "--trace", str(TRACE),
                "--target", ",".join(workers), "--time-scale", repr(time_scale),
                "--rate-scale", repr(rate_scale), "--start-at", repr(start_at), "--json",
                "--out", str(requests_csv), "--max-failed", "1",
            ],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        summary = json.loads(replay.stdout.strip().splitlines()[-1])
        stats = [httpx.get(f"{w}/v1/stats", timeout=5).json() for w in workers]
        pool = httpx.get(f"{api}/v1/pools/live", timeout=5).json()
    finally:
        controller.terminate()
        controller.wait(timeout=60)
    return figures(policy, summary, stats, pool, requests_csv)


def figures(policy: str, summary: dict, stats: list[dict], pool: dict, requests: Path) -> dict:
    with requests.open() as f:
        rows = list(csv.DictReader(f))
    latencies = np.array([float(r["latency_s"]) for r in rows if r["status"] == "200"])
    completed = sum(s["completed"] for s in stats)
    batches = sum(s["batches"] for s in stats)
    busy_s = sum(s["busy_s"] for s in stats)
    return {
        "policy": policy,
        "requests": len(rows),
        "ok": int(latencies.size),
        "p50_ms": round(float(np.quantile(latencies, 0.5)) * 1e3, 2),
        "p99_ms": round(float(np.quantile(latencies, 0.99)) * 1e3, 2),
        "slo_attainment": round(float((latencies <= SLO_S).sum()) / max(len(rows), 1), 5),
        "busy_s": round(busy_s, 3),
        "busy_seconds_per_1k": round(busy_s / max(completed, 1) * 1e3, 4),
        "mean_batch_size": round(completed / max(batches, 1), 3),
        "config_changes": pool["config_changes"],
        "send_lag_p99_ms": summary["send_lag_p99_ms"],
    }


def table(rows: list[dict]) -> str:
    header = (
        f"{'policy':36} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'SLO %':>7} "
        f"{'busy/1k':>8} {'batch':>6} {'changes':>7}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['policy']:36} {r['requests']:>8} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
            f"{r['slo_attainment'] * 100:>7.2f} {r['busy_seconds_per_1k']:>8.3f} "
            f"{r['mean_batch_size']:>6.2f} {r['config_changes']:>7}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="the day replayed in")
    parser.add_argument("--peak-rps", type=float, default=120.0, help="replayed peak rate")
    parser.add_argument("--policy", action="append", help="policies (default: 3)")
    parser.add_argument(
        "--latency-drift",
        type=float,
        default=0.2,
        help="the controller's --latency-drift (0: plan on the profile throughout)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidal-live-"))
    started = time.perf_counter()
    run_tidal(
        "profile", "--model", "demo-cnn", "--batch-sizes", "1,2,4,8,16,32,64",
        "--runs", "10", "--out", str(work / "profile.json"), quiet=True,
    )  # fmt: skip
    rows = [run_policy(p, args, work) for p in (args.policy or POLICIES)]
    print(table(rows))
    baseline = {r["policy"]: r for r in rows}
    ratios = {
        f"predictive_vs_{p}": {
            "busy_per_1k": round(
                baseline["predictive"]["busy_seconds_per_1k"] / r["busy_seconds_per_1k"], 3
            ),
            "p99": round(baseline["predictive"]["p99_ms"] / r["p99_ms"], 3),
        }
        for p, r in baseline.items()
        if p != "predictive" and "predictive" in baseline
    }
    for name, ratio in ratios.items():
        print(f"{name}: busy/1k x{ratio['busy_per_1k']}, p99 x{ratio['p99']}")
    print(
        json.dumps(
            {
                "seconds": args.seconds,
                "latency_drift": args.latency_drift,
                "peak_rps": args.peak_rps,
                "slo_ms": SLO_S * 1e3,
                "results": rows,
                "ratios": ratios,
                "wall_s": round(time.perf_counter() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
