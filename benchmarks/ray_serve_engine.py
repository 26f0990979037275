"""Ray Serve on one machine: a static `@serve.batch(16, 10 ms)` against Tidal steering it.

One replica of the example's demo CNN behind Serve's HTTP proxy, on a Ray cluster on
loopback, driven open loop (Poisson arrivals) at each rate for a few seconds, several
times. First the plain deployment (examples/ray_serve_static.py, the config fixed in the
decorator), then the same model and handler under `@tidal_batch`
(examples/ray_serve_app.py) with a `tidal controller` running the predictive policy
(its latency model is a line fitted to the batch times the static replica's handler
measured under this load). For each run: the rate offered (sent) and achieved,
client-side p50/p99, errors, the mean batch size and the config in force after it. A
rate is sustained when every repeat answers everything, at least 95% of the offered
rate, with p99 within the SLO.

    PYTHONPATH=. python benchmarks/ray_serve_engine.py [--rates 10,20,30,40,50] \\
        [--seconds 8] [--repeats 2] [--slo 250ms]

Prints a table; the last line is one JSON object with every figure. The machine's two
cores run Ray, the proxy, the replica, the controller and the load generator together,
beside whatever else the machine runs: the ceiling is the machine's and Serve's HTTP
path's, and the figures are noisy; compare the variants, repeat by repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from ray_cluster import OpenLoopLoad, demo_payloads, ray_serve_cluster
from redis_server import RedisProcess, free_port

from tidal_base.units import parse_duration_s

POOL = "bench"
APP = "bench"
SETTLE_S = 2.0  # each run's first seconds are not measured: a config catches up
STATIC = "max_batch=16,timeout=10ms"


def fit_latency_model(runs: list[dict]) -> tuple[float, float]:
    """(base ms, ms per item) fitted to the batches the static replica ran (their
    execution times as its handler measured them, under this load): the planner's model."""
    sizes = np.array([b for r in runs for b, _ in r["batches"]], dtype=float)
    times = np.array([ms for r in runs for _, ms in r["batches"]])
    if np.unique(sizes).size < 2:
        raise RuntimeError("the static runs ran one batch size only: no latency model to fit")
    per_item, base = np.polyfit(sizes, times, 1)
    return max(0.1, float(base)), max(0.01, float(per_item))


def measure(url: str, rate: float, seconds: float, seed: int) -> dict:
    payloads, content_type = demo_payloads()
    load = OpenLoopLoad(f"{url}/v1/infer", rate, payloads, content_type, seed=seed)
    started = time.time()
    load.start()
    time.sleep(seconds)
    load.stop()
    window_s = seconds - SETTLE_S
    sent = load.between(started + SETTLE_S, started + seconds)
    ok = np.array([s.latency_s for s in sent if s.status == 200])
    timings = [s.timing for s in sent if s.timing]
    versions = sorted({t["config_version"] for t in timings if "config_version" in t})
    caps = sorted({t["max_batch_size"] for t in timings if "max_batch_size" in t})
    batches = [(t["batch_size"], t["execution_ms"]) for t in timings]
    # Each request's share of its batch's execution: the compute a request costs.
    shares = [ms / size for size, ms in batches]
    return {
        "rate_rps": rate,
        "offered_rps": round(len(sent) / window_s, 1),
        "achieved_rps": round(ok.size / window_s, 1),
        "errors": len(sent) - int(ok.size) + load.not_sent,
        "p50_ms": round(float(np.quantile(ok, 0.5)) * 1e3, 1) if ok.size else None,
        "p99_ms": round(float(np.quantile(ok, 0.99)) * 1e3, 1) if ok.size else None,
        "mean_batch": round(float(np.mean([t["batch_size"] for t in timings])), 2)
        if timings
        else None,
        "compute_ms_per_request": round(float(np.mean(shares)), 2) if shares else None,
        "config_versions": versions,
        "caps": caps,
        "batches": batches,
    }


def sustained(run: dict, slo_ms: float) -> bool:
    return (
        run["errors"] == 0
        and run["p99_ms"] is not None
        and run["p99_ms"] <= slo_ms
        and run["achieved_rps"] >= 0.95 * run["offered_rps"]
    )


def sweep(url: str, variant: str, args: argparse.Namespace, config=None) -> list[dict]:
    """Every rate, `repeats` times; `config()` names the config in force after a run."""
    runs = []
    for rate in args.rates:
        for repeat in range(args.repeats):
            run = {"variant": variant, "repeat": repeat, **measure(url, rate, args.seconds, repeat)}
            run["sustained"] = sustained(run, args.slo_s * 1e3)
            run["config"] = config() if config is not None else STATIC
            runs.append(run)
            print(_row(run), flush=True)
            time.sleep(1.0)  # the queue drains between runs
    return runs


def start_controller(redis_url: str, port: int, model: tuple[float, float], args, log: Path):
    base_ms, per_item_ms = model
    return subprocess.Popen(
        [
            sys.executable, "-m", "server.cli", "controller", "--redis", redis_url,
            "--pool", POOL, "--policy", "predictive:step=2s", "--workers", "1",
            "--latency-model", f"linear:{base_ms:.2f},{per_item_ms:.3f}",
            "--slo", f"{args.slo_s * 1e3:g}ms", "--tick", "0.5s",
            "--guard", f"max_batch={args.max_ongoing // 2},dwell=5s", "--port", str(port),
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def _config_in_force(api: str) -> str:
    config = httpx.get(f"{api}/v1/pools/{POOL}", timeout=5).json()["config"]
    return f"max_batch={config['max_batch']},timeout={config['timeout_ms']:g}ms"


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10,20,30,40,50", help="req/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0, help="each run's length")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--slo", default="250ms", help="p99 a sustained rate must meet")
    parser.add_argument("--max-ongoing", type=int, default=64, help="max_ongoing_requests")
    args = parser.parse_args()
    args.rates = [float(r) for r in args.rates.split(",")]
    args.slo_s = parse_duration_s(args.slo, field="--slo")
    if args.seconds <= SETTLE_S + 1:
        parser.error(f"--seconds must be > {SETTLE_S + 1:g}")
    began = time.monotonic()
    # Ray nices its workers to 15; the load generator here runs at 0 on the same cores
    # and would starve Serve's proxy and replica (p50 390 ms at 40 req/s against 74 ms).
    os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112 (Ray's own spelling)
    print(_header())
    server = RedisProcess()
    server.start()
    port = free_port()
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"ray_serve_bench_{os.getpid()}"
    work.mkdir(exist_ok=True)
    controller = None
    runs: list[dict] = []
    try:
        with ray_serve_cluster(num_cpus=2) as url:
            from ray import serve

            from examples import ray_serve_app, ray_serve_static

            serve.run(ray_serve_static.build(max_ongoing_requests=args.max_ongoing), name=APP)
            runs += sweep(url, "static-16-10ms", args)
            serve.delete(APP)
            model = fit_latency_model(runs)
            print(
                f"latency model (the static replica's batches): {model[0]:.2f} ms + "
                f"{model[1]:.3f} ms per image"
            )
            controller = start_controller(server.url, port, model, args, work / "controller.log")
            api = f"http://127.0.0.1:{port}"
            bound = ray_serve_app.build(
                POOL, server.url, replicas=1, max_ongoing_requests=args.max_ongoing
            )
            serve.run(bound, name=APP)
            wait_for(
                lambda: httpx.get(f"{api}/v1/pools/{POOL}").json()["workers_alive"] == 1,
                60,
                "the replica in the pool",
            )
            runs += sweep(url, "tidal-predictive", args, lambda: _config_in_force(api))
            changes = httpx.get(f"{api}/v1/pools/{POOL}").json()["config_changes"]
    finally:
        if controller is not None and controller.poll() is None:
            controller.send_signal(signal.SIGTERM)
            controller.wait(20)
        server.stop()
    summary = _summary(runs, args, model, changes, time.monotonic() - began)
    print()
    for variant, rate in summary["sustained_rps"].items():
        print(
            f"{variant}: highest rate sustained in every repeat: {rate} req/s "
            f"(p99 <= {args.slo_s * 1e3:g} ms, nothing failed)"
        )
    print(json.dumps(summary))
    return 0


def _summary(runs, args, model, changes, wall_s) -> dict:
    best: dict[str, float | None] = {}
    for variant in dict.fromkeys(r["variant"] for r in runs):
        ok_rates = [
            rate
            for rate in args.rates
            if all(
                r["sustained"] for r in runs if r["variant"] == variant and r["rate_rps"] == rate
            )
        ]
        best[variant] = max(ok_rates) if ok_rates else None
    return {
        "benchmark": "ray_serve_engine",
        "slo_ms": args.slo_s * 1e3,
        "seconds_per_run": args.seconds,
        "repeats": args.repeats,
        "max_ongoing_requests": args.max_ongoing,
        "latency_model_ms": {"base": round(model[0], 3), "per_item": round(model[1], 3)},
        "tidal_config_changes": changes,
        "sustained_rps": best,
        "wall_s": round(wall_s, 1),
        "runs": [{k: v for k, v in r.items() if k != "batches"} for r in runs],
    }


def _header() -> str:
    return (
        f"{'variant':<17} {'rate':>5} {'rep':>3} {'offered':>8} {'achieved':>8} {'err':>4} "
        f"{'p50 ms':>7} {'p99 ms':>7} {'batch':>6} {'ms/req':>6}  {'ok':<3} config after the run"
    )


def _row(r: dict) -> str:
    return (
        f"{r['variant']:<17} {r['rate_rps']:>5.0f} {r['repeat']:>3} {r['offered_rps']:>8.1f} "
        f"{r['achieved_rps']:>8.1f} {r['errors']:>4} {r['p50_ms']!s:>7} {r['p99_ms']!s:>7} "
        f"{r['mean_batch']!s:>6} {r['compute_ms_per_request']!s:>6}  "
        f"{'yes' if r['sustained'] else 'no':<3} {r['config']}"
    )


if __name__ == "__main__":
    sys.exit(main())
