"""Simulator fidelity: does `simulate` predict what a live worker does?

1. Profile the demo CNN on this machine (`tidal profile`, in process).
2. Simulate a bursty trace (the Azure LLM trace in ../shared/traces, time-compressed)
   with that profile, one worker, a static config.
3. Replay the same trace live against one `tidal worker` with the same config (the
   open-loop load generator, binary bodies) and read, per request, the worker's own
   account of queue wait and execution (so HTTP transport is outside both sides).
4. Compare mean batch size (target within 10%) and p50/p99 of queue wait + execution
   (target within 20%).

    PYTHONPATH=. python benchmarks/sim_fidelity.py [--time-scale 20] [--duration 60s]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from adaptive.latency import parse_latency_model
from adaptive.specs import PolicyContext, build_policy
from server.cli import main as tidal
from server.tools.loadgen import arrival_times, encode_payloads, replay
from server.worker.models import load_model
from simulations.engine import PoolSettings
from simulations.run import SimulationSettings, simulate
from simulations.traces import load_trace

sys.path.insert(0, str(Path(__file__).parent))
from batching_gain import start_worker

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT.parent / "shared" / "traces" / "azure_llm_conv_2023.csv"
CONFIG = "max_batch=16,timeout=10ms"


def profile(path: Path) -> None:
    argv = ["profile", "--model", "demo-cnn", "--batch-sizes", "1,2,4,8,16", "--runs", "30"]
    assert tidal([*argv, "--out", str(path)]) == 0


def simulated(profile_path: Path, time_scale: float, duration_s: float) -> dict:
    trace = load_trace(AZURE, time_scale=time_scale)
    latency = parse_latency_model(str(profile_path))
    settings = SimulationSettings(pool=PoolSettings(1, 1.0, record_requests=True))
    policy = build_policy(f"static:{CONFIG}", PolicyContext(1.0, 1))
    result = simulate(trace, [policy], settings, latency).results[0]
    records = result.records
    keep = records[:, 1] < duration_s  # REC_ARRIVED_AT
    latency_s = records[keep, 3] - records[keep, 1]  # completed - arrived
    batches = records[keep, 5]
    sizes = np.bincount(batches.astype(np.int64))
    return _figures(latency_s, float(sizes[sizes > 0].mean()), int(keep.sum()))


def live(time_scale: float, duration_s: float) -> dict:
    process, url = start_worker(CONFIG)
    try:
        times = arrival_times(AZURE, time_scale, 1.0, duration_s, seed=0)
        payloads, content_type = encode_payloads(load_model("demo-cnn"), "binary")
        results = asyncio.run(replay(url, times, payloads, 2000, content_type))
    finally:
        process.terminate()
        process.wait(30)
    ok = [r for r in results if r.status == 200]
    # The worker's own account: queue wait + execution, without HTTP transport.
    server_s = np.array([(r.queue_wait_ms + r.execution_ms) / 1e3 for r in ok])
    mean_batch = _mean_batch_per_batch([r.batch_size for r in ok])
    figures = _figures(server_s, mean_batch, len(ok))
    figures["failed"] = len(results) - len(ok)
    figures["client_p99_ms"] = round(float(np.quantile([r.latency_s for r in ok], 0.99)) * 1e3, 3)
    return figures


def _mean_batch_per_batch(per_request_sizes: list[int]) -> float:
    """Mean batch size over batches (each batch of n is seen by n requests)."""
    sizes = np.array(per_request_sizes, dtype=float)
    return float(sizes.size / np.sum(1.0 / sizes))


def _figures(latency_s: np.ndarray, mean_batch: float, requests: int) -> dict:
    return {
        "requests": requests,
        "mean_batch_size": round(mean_batch, 3),
        "p50_ms": round(float(np.quantile(latency_s, 0.5)) * 1e3, 3),
        "p99_ms": round(float(np.quantile(latency_s, 0.99)) * 1e3, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of replay")
    args = parser.parse_args()
    if not AZURE.exists():
        print(f"{AZURE} not found: this benchmark needs ../shared/traces")
        return 1
    with tempfile.TemporaryDirectory() as folder:
        profile_path = Path(folder) / "profile.json"
        profile(profile_path)
        sim = simulated(profile_path, args.time_scale, args.duration)
        real = live(args.time_scale, args.duration)
    errors = {
        key: round(sim[key] / real[key] - 1, 4) for key in ("mean_batch_size", "p50_ms", "p99_ms")
    }
    targets = {"mean_batch_size": 0.10, "p50_ms": 0.20, "p99_ms": 0.20}
    print(f"\n{'':<16} {'simulated':>10} {'live':>10} {'error':>8} {'target':>8}")
    for key, limit in targets.items():
        met = abs(errors[key]) <= limit
        print(
            f"{key:<16} {sim[key]:>10} {real[key]:>10} {errors[key]:>+8.1%} "
            f"{'met' if met else 'MISSED':>8}"
        )
    print(f"live client-side p99 (with HTTP): {real['client_p99_ms']} ms; failed {real['failed']}")
    print(
        json.dumps(
            {
                "benchmark": "sim_fidelity",
                "config": CONFIG,
                "time_scale": args.time_scale,
                "duration_s": args.duration,
                "simulated": sim,
                "live": real,
                "relative_error": errors,
                "met": {k: abs(errors[k]) <= v for k, v in targets.items()},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
