"""Simulator fidelity: does `simulate` predict what a live worker does, and what its
clients see?

1. Two latency profiles of the demo CNN on this machine: `tidal profile` in process
   (the model alone, with the cores to itself), and `tidal profile --under-load`
   against a running worker serving Poisson load at 50, 100 and 200 req/s (what the
   hardware gives while it serves; no trace below is used to take it).
2. Per trace (the bursty Azure LLM trace it was first tuned on, and two compressed days
   of NYC taxi demand it never was), replay the arrivals live against a fresh `tidal
   worker` (open loop, binary bodies, one static config) and read, per request, three
   accounts: the worker's own (queue wait + execution), the worker's from its socket
   (+ ingress, the HTTP layer's queue) and the client's (send to answer).
3. Simulate the same arrival times with each profile, padded to the worker's warmed
   power-of-two buckets as the worker runs them. For the client's account, also the
   simulation plus what a request waits outside the batcher, drawn independently from
   the distribution the profile under load measured at the rate nearest the load
   around that request (arrivals within a second; `request_overhead_ms`: client
   latency minus queue wait and execution, in the held-out profiling run).
4. Compare mean batch size (target within 10%) and p50/p99 (target within 20%).

    PYTHONPATH=. python benchmarks/sim_fidelity.py [--duration 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adaptive.latency import parse_latency_model
from adaptive.specs import PolicyContext, build_policy
from server.cli import main as tidal
from server.tools.loadgen import arrival_times, encode_payloads, replay
from server.worker.models import load_model
from simulations.engine import PoolSettings
from simulations.run import SimulationSettings, simulate
from simulations.traces import RequestTrace

sys.path.insert(0, str(Path(__file__).parent))
from batching_gain import start_worker

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
CONFIG = "max_batch=16,timeout=10ms"
UNDER_LOAD_RATES = "50,100,200"
TARGETS = {"mean_batch_size": 0.10, "p50_ms": 0.20, "p99_ms": 0.20}


@dataclass(frozen=True)
class Replay:
    name: str
    path: Path
    time_scale: float
    rate_scale: float
    tuned_on: bool  # the trace this benchmark was first written against


TRACES = (
    Replay("azure-llm x20", SHARED / "azure_llm_conv_2023.csv", 20.0, 1.0, True),
    # Two days (96 half-hours) in 60 s: 2,880x time, scaled to a ~110 req/s mean.
    Replay("nyc-taxi 2 days", SHARED / "nyc_taxi.csv", 2880.0, 1 / 225, False),
)


def profiles(folder: Path) -> dict[str, Path]:
    alone, served = folder / "alone.json", folder / "served.json"
    argv = ["profile", "--model", "demo-cnn", "--batch-sizes", "1,2,4,8,16", "--runs", "30"]
    assert tidal([*argv, "--out", str(alone)]) == 0
    process, url = start_worker(CONFIG)
    try:
        argv = ["profile", "--model", "demo-cnn", "--under-load", url, "--rates"]
        argv += [UNDER_LOAD_RATES, "--seconds", "10", "--runs", "10", "--out", str(served)]
        assert tidal(argv) == 0
    finally:
        process.terminate()
        process.wait(30)
    return {"alone": alone, "under load": served}


def with_overhead(
    latency_s: np.ndarray, arrived_s: np.ndarray, profile_path: Path, seed: int = 0
) -> np.ndarray:
    """Simulated latencies plus independent draws of the request overhead the profile
    measured at the rate nearest (in log) each request's local rate: the HTTP layer
    queues more at a peak than on average."""
    entries = json.loads(profile_path.read_text())["request_overhead_ms"]
    order = np.sort(arrived_s)
    local_rps = np.searchsorted(order, arrived_s + 0.5) - np.searchsorted(order, arrived_s - 0.5)
    profiled = np.log([e["rate_rps"] for e in entries])
    nearest = np.abs(np.log(np.maximum(local_rps, 1))[:, None] - profiled[None, :]).argmin(1)
    draws = np.random.default_rng(seed).random(latency_s.size)
    overhead_ms = np.empty_like(latency_s)
    for i, entry in enumerate(entries):
        at = nearest == i
        overhead_ms[at] = np.interp(draws[at], entry["levels"], entry["quantiles"])
    return latency_s + overhead_ms / 1e3


def simulated(times: np.ndarray, profile_path: Path) -> dict:
    trace = RequestTrace("live arrivals", np.sort(times))
    latency = parse_latency_model(str(profile_path))
    # The worker warmed its buckets before the replay and pads every batch to one: a
    # 1 ms warm-up per bucket makes the simulator pad the same way from its start.
    pool = PoolSettings(1, 1.0, record_requests=True, warmup_s=0.001)
    policy = build_policy(f"static:{CONFIG}", PolicyContext(1.0, 1))
    result = simulate(trace, [policy], SimulationSettings(pool=pool), latency).results[0]
    records = result.records
    latency_s = records[:, 3] - records[:, 1]  # completed - arrived
    sizes = np.bincount(records[:, 5].astype(np.int64))
    mean_batch = float(sizes[sizes > 0].mean())
    figures = {"sim": _figures(latency_s, mean_batch, len(latency_s))}
    if "request_overhead_ms" in json.loads(profile_path.read_text()):
        client_s = with_overhead(latency_s, records[:, 1], profile_path)
        figures["sim + overhead"] = _figures(client_s, mean_batch, len(latency_s))
    return figures


def live(times: np.ndarray) -> dict:
    process, url = start_worker(CONFIG)
    try:
        payloads, content_type = encode_payloads(load_model("demo-cnn"), "binary")
        results = asyncio.run(replay(url, times, payloads, 2000, content_type))
    finally:
        process.terminate()
        process.wait(30)
    ok = [r for r in results if r.status == 200]
    mean_batch = _mean_batch_per_batch([r.batch_size for r in ok])
    own = np.array([(r.queue_wait_ms + r.execution_ms) / 1e3 for r in ok])
    ingress = np.array([r.ingress_ms / 1e3 for r in ok])
    client = np.array([r.latency_s for r in ok])
    accounts = {
        "worker": _figures(own, mean_batch, len(ok)),
        "worker + ingress": _figures(own + ingress, mean_batch, len(ok)),
        "client": _figures(client, mean_batch, len(ok)),
    }
    accounts["worker"]["failed"] = len(results) - len(ok)
    lag = np.array([r.sent_s - r.scheduled_s for r in results])
    accounts["worker"]["send_lag_p99_ms"] = round(float(np.quantile(lag, 0.99)) * 1e3, 3)
    return accounts


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


def compare(sim: dict, real: dict) -> dict:
    errors = {key: round(sim[key] / real[key] - 1, 4) for key in TARGETS}
    return {"error": errors, "met": {k: abs(errors[k]) <= v for k, v in TARGETS.items()}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of replay")
    args = parser.parse_args()
    missing = [str(r.path) for r in TRACES if not r.path.exists()]
    if missing:
        print(f"{missing[0]} not found: this benchmark needs ../shared/traces")
        return 1
    results = []
    with tempfile.TemporaryDirectory() as folder:
        paths = profiles(Path(folder))
        for trace in TRACES:
            times = arrival_times(trace.path, trace.time_scale, trace.rate_scale, args.duration, 0)
            real = live(times)
            for profile, path in paths.items():
                predicted = simulated(times, path)
                pairs = [("sim", account) for account in real]
                if "sim + overhead" in predicted:
                    pairs.append(("sim + overhead", "client"))
                for kind, account in pairs:
                    sim, figures = predicted[kind], real[account]
                    results.append(
                        {
                            "trace": trace.name,
                            "tuned_on": trace.tuned_on,
                            "profile": profile if kind == "sim" else f"{profile} + HTTP",
                            "live_account": account,
                            "simulated": sim,
                            "live": figures,
                            **compare(sim, figures),
                        }
                    )
    print(_table(results))
    print(json.dumps({"benchmark": "sim_fidelity", "config": CONFIG, "results": results}))
    return 0


def _table(results: list[dict]) -> str:
    header = (
        f"{'trace':16} {'profile':18} {'live account':17} {'batch sim/live':>15} "
        f"{'p50 ms sim/live':>17} {'p99 ms sim/live':>17}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        cells = []
        for key in TARGETS:
            sim, real, error = r["simulated"][key], r["live"][key], r["error"][key]
            mark = "" if r["met"][key] else "!"
            cells.append(f"{sim:.1f}/{real:.1f} {error:+.0%}{mark}")
        lines.append(
            f"{r['trace']:16} {r['profile']:18} {r['live_account']:17} {cells[0]:>15} "
            f"{cells[1]:>17} {cells[2]:>17}"
        )
    lines.append("! : outside the target (batch within 10%, p50 and p99 within 20%)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
