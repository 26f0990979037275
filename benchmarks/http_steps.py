"""The worker's HTTP path, one step at a time: what each choice of server saves a request.

The same `tidal worker --model demo-cnn --config max_batch=16,timeout=10ms` (1 torch
thread: the worker's better setting on 2 cores, benchmarks/vs_ray_serve.py), the same
binary payload and open-loop Poisson client (benchmarks/open_loop.py), one server at a
time, four steps:

- `h11 + asyncio`: uvicorn's pure-Python HTTP parser on the standard event loop (what
  uvicorn runs when neither httptools nor uvloop is installed: the worker of wave 1);
- `httptools + asyncio`: uvicorn's C parser (llhttp), the standard loop;
- `httptools + uvloop`: the worker as it ships (`server.http_edge`: httptools with a
  deadline on request heads, uvloop);
- `+ 1 front end`: the worker with `--frontends 1` (HTTP and decoding in a front-end
  process, the batches and the model in the model process; docs/worker.md).

The first two run the worker through benchmarks/worker_uvicorn.py, which swaps only the
uvicorn config the worker serves with. Each step runs at each `--rates` (below every
step's capacity, so each answers everything) `--repeats` times; the figures are the
server's CPU per request (every process of the worker, from /proc, by process), its p50
and p99, and the model's busy ratio. CPU per request is the step's cost: at a fixed rate
it does not depend on how fast the machine is, only on what the server does per request.

    PYTHONPATH=. python benchmarks/http_steps.py               # about 4 minutes

Prints each run as it goes, then a table; the last line is one JSON object with every
figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from vs_ray_serve import (  # it puts tests/ (processes, redis_server) on the path
    LoadSettings,
    Run,
    WorkerVariant,
    measure,
    tidal_up,
)

SWAP = str(Path(__file__).resolve().parent / "worker_uvicorn.py")

STEPS = (
    WorkerVariant("h11 + asyncio", launcher=(SWAP, "h11", "asyncio")),
    WorkerVariant("httptools + asyncio", launcher=(SWAP, "httptools", "asyncio")),
    WorkerVariant("httptools + uvloop"),
    WorkerVariant("+ 1 front end", ("--frontends", "1")),
)


@dataclass(frozen=True, slots=True)
class Settings:
    """The command line: rates, repeats, each run's load, and the SLO a run is judged by."""

    rates: tuple[float, ...]
    repeats: int
    load: LoadSettings
    slo_ms: float
    threads: int
    pause_s: float


def run_step(step: WorkerVariant, settings: Settings, work: Path) -> list[Run]:
    runs: list[Run] = []
    judged = {"load": settings.load, "slo_ms": settings.slo_ms, "pause_s": settings.pause_s}
    with tidal_up(step, settings.threads, None, settings.slo_ms, work) as target:
        for rate in settings.rates:
            for repeat in range(settings.repeats):
                run = measure(step.name, settings.threads, target, rate, repeat, **judged)
                print(_line(run), flush=True)
                runs.append(run)
    return runs


def _line(run: Run) -> str:
    by = ", ".join(f"{k} {v:.2f}" for k, v in run.cpu_ms_by_process.items())
    return (
        f"  {run.server:22} {run.rate_rps:5g} req/s #{run.repeat}: errors {run.errors}, "
        f"p50 {run.p50_ms} p99 {run.p99_ms} ms, server {run.server_cpu_ms:.2f} CPU ms/req "
        f"({by}), busy {run.busy_ratio}"
    )


def summary(step: WorkerVariant, runs: list[Run], rate: float) -> dict:
    """Medians over the step's repeats at one rate (and the CPU's spread)."""
    at = [r for r in runs if r.rate_rps == rate]
    cpu = [r.server_cpu_ms for r in at]
    frontend = [r.cpu_ms_by_process.get("worker children", 0.0) for r in at]
    return {
        "step": step.name,
        "rate_rps": rate,
        "runs": len(at),
        "errors": sum(r.errors for r in at),
        "server_cpu_ms": round(statistics.median(cpu), 3),
        "server_cpu_ms_range": [min(cpu), max(cpu)],
        "frontend_cpu_ms": round(statistics.median(frontend), 3) if any(frontend) else None,
        "p50_ms": _median_of(r.p50_ms for r in at),
        "p99_ms": _median_of(r.p99_ms for r in at),
        "busy_ratio": _median_of((r.busy_ratio for r in at), digits=3),
        "client_cpu_ms": round(statistics.median(r.client_cpu_ms for r in at), 3),
    }


def _median_of(values, digits: int = 1) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), digits) if present else None


def print_table(rows: list[dict]) -> None:
    print()
    print(
        "| step | rate | errors | server CPU ms/req (range) | of it, front end | vs h11 "
        "| p50 / p99 ms | busy |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    first = {r["rate_rps"]: r["server_cpu_ms"] for r in rows if r["step"] == STEPS[0].name}
    for r in rows:
        low, high = r["server_cpu_ms_range"]
        front = "" if r["frontend_cpu_ms"] is None else f"{r['frontend_cpu_ms']:.2f}"
        ratio = first[r["rate_rps"]] / r["server_cpu_ms"]
        print(
            f"| {r['step']} | {r['rate_rps']:g} | {r['errors']} | {r['server_cpu_ms']:.2f} "
            f"({low:.2f}-{high:.2f}) | {front} | {ratio:.2f}x | {r['p50_ms']} / {r['p99_ms']} "
            f"| {r['busy_ratio']} |"
        )


def parse_args(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--rates", default="100,250", help="Poisson rates, req/s (default 100,250)")
    add("--repeats", type=int, default=2, help="runs per rate (default 2)")
    add("--seconds", type=float, default=8.0, help="each run's length (default 8)")
    add("--settle", type=float, default=1.0, help="unmeasured start of each run (default 1)")
    add("--slo", type=float, default=200.0, help="p99 bound a run is judged by, ms")
    add("--threads", type=int, default=1, help="torch threads (default 1)")
    add("--pause", type=float, default=1.0, help="idle seconds between runs (default 1)")
    args = parser.parse_args(argv)
    try:
        rates = tuple(float(r) for r in args.rates.split(","))
        load = LoadSettings(args.seconds, args.settle, timeout_s=2.0)
    except ValueError as error:
        parser.error(str(error))
    if args.repeats < 1 or args.threads < 1 or not all(r > 0 for r in rates):
        parser.error("--repeats, --threads and every rate must be positive")
    return Settings(rates, args.repeats, load, args.slo, args.threads, args.pause)


def main(argv: list[str] | None = None) -> int:
    settings = parse_args(argv)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="tidal-http-steps-"))
    print(f"workers' logs in {work}", flush=True)
    rows = []
    for step in STEPS:
        print(f"-- {step.name}", flush=True)
        runs = run_step(step, settings, work)
        rows += [summary(step, runs, rate) for rate in settings.rates]
    print_table(rows)
    report = {
        "settings": {**asdict(settings), "load": asdict(settings.load)},
        "steps": rows,
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
