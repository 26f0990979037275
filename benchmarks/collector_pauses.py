"""Full garbage collections in compiled workers and in the load generator, with and
without freezing what was built before serving, side by side.

A compiled `demo-ranker` worker holds torch.compile's graphs and caches: a large heap of
Python objects that a full (generation 2) collection walks. The worker freezes it after
each warm-up (`gc.freeze`, server.worker.runner.ThreadedExecution), and `tidal loadgen`
replays with the collector paused (`server.tools.loadgen.collector_paused`). Per variant,
two fresh workers (one torch thread each) serve Poisson load from this process at each
rate, and a `sitecustomize` on the workers' path logs every collection over 20 ms with
its time; this process's own collections are logged the same way.

- `frozen`: as shipped;
- `unfrozen`: the workers' `gc.freeze` made a no-op and the replay run with the
  collector on, as before the change.

    PYTHONPATH=. python benchmarks/collector_pauses.py [--rates 900,900,1200] [--seconds 8]

Prints per variant and rate the share within the 100 ms SLO, p99 and max, and the
collections over 20 ms during the load (workers', client's); the last line is one JSON
object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import tidal_workers, torch_threads_env

from server.tools.loadgen import collector_paused, encode_payloads, replay
from server.worker.models import load_model

MODEL = "demo-ranker"
SLO_S = 0.1
LONG_S = 0.02

SITECUSTOMIZE = """
import gc, os, sys, time
_started = [0.0]
def _log(phase, info):
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    took = time.perf_counter() - _started[0]
    if took > {long_s!r}:
        with open({log!r}, "a") as out:
            out.write(f"{{time.time():.3f}} {{os.getpid()}} {{info['generation']}} {{took:.4f}}\\n")
gc.callbacks.append(_log)
if os.environ.get("TIDAL_BENCH_NO_FREEZE"):
    gc.freeze = lambda: None
"""


def _pauses(log: Path, since: float, until: float) -> list[float]:
    if not log.exists():
        return []
    pauses = []
    for line in log.read_text().splitlines():
        at, _pid, _gen, took = line.split()
        if since <= float(at) <= until:
            pauses.append(float(took))
    return pauses


def _client_logger(log: Path):
    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        elif time.perf_counter() - started[0] > LONG_S:
            with log.open("a") as out:
                took = time.perf_counter() - started[0]
                out.write(f"{time.time():.3f} {os.getpid()} {info['generation']} {took:.4f}\n")

    return callback


def run_variant(name: str, frozen: bool, rates: list[float], seconds: float, work: Path):
    site = work / name
    site.mkdir()
    worker_log, client_log = work / f"{name}-workers.gc", work / f"{name}-client.gc"
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(long_s=LONG_S, log=str(worker_log)))
    env = torch_threads_env(1)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    if not frozen:
        env["TIDAL_BENCH_NO_FREEZE"] = "1"
    argv = ["--model", MODEL, "--config", "max_batch=32,timeout=20ms", "--slo", "100ms"]
    payloads, content_type = encode_payloads(load_model(MODEL), "binary")
    callback = _client_logger(client_log)
    gc.callbacks.append(callback)
    rows = []
    try:
        with tidal_workers(argv, 2, env, work / name) as urls:
            for i, rate in enumerate(rates):
                rng = np.random.default_rng(i)
                times = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.5)))
                times = times[times < seconds]
                began = time.time()
                paused = collector_paused() if frozen else contextlib.nullcontext()
                with paused:
                    results = uvloop.run(replay(urls, times, payloads, 2000, content_type))
                ended = time.time()
                ok = np.array([r.latency_s for r in results if r.status == 200])
                within = sum(r.status == 200 and r.latency_s <= SLO_S for r in results)
                workers = _pauses(worker_log, began, ended)
                client = _pauses(client_log, began, ended)
                rows.append(
                    {
                        "variant": name,
                        "rate_rps": rate,
                        "requests": len(results),
                        "slo_attainment": round(within / max(len(results), 1), 5),
                        "p99_ms": round(float(np.quantile(ok, 0.99)) * 1e3, 1),
                        "max_ms": round(float(ok.max()) * 1e3, 1),
                        "worker_pauses": len(workers),
                        "worker_pause_max_ms": round(max(workers, default=0) * 1e3, 1),
                        "client_pauses": len(client),
                        "client_pause_max_ms": round(max(client, default=0) * 1e3, 1),
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        gc.callbacks.remove(callback)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="900,900,1200")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    work = Path(tempfile.mkdtemp(prefix="tidal-gc-"))
    rows = run_variant("unfrozen", False, rates, args.seconds, work)
    rows += run_variant("frozen", True, rates, args.seconds, work)
    header = (
        f"{'variant':9} {'rate':>6} {'SLO %':>7} {'p99 ms':>7} {'max ms':>7} "
        f"{'worker pauses (max ms)':>23} {'client pauses (max ms)':>23}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['variant']:9} {r['rate_rps']:>6.0f} {r['slo_attainment'] * 100:>7.2f} "
            f"{r['p99_ms']:>7.1f} {r['max_ms']:>7.1f} "
            f"{r['worker_pauses']:>13} ({r['worker_pause_max_ms']:>6.1f}) "
            f"{r['client_pauses']:>14} ({r['client_pause_max_ms']:>6.1f})"
        )
    print(json.dumps({"model": MODEL, "seconds": args.seconds, "runs": rows}))


if __name__ == "__main__":
    main()
