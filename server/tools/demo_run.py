"""`tidal demo`, the run itself: what `server.tools.demo` describes (its flags live there,
and import this only when the demo runs, so `tidal demo --help` loads none of the
simulator or the web stack).
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from adaptive.latency import LatencyModel, parse_latency_model
from adaptive.optimizer import ConfigOptimizer
from adaptive.policy_kinds import POLICY_KINDS
from adaptive.specs import parse_policy_spec
from forecaster.events import Event, event_to_dict, load_events, rescale_events
from forecaster.series import epoch_seconds
from server.ports import check_free
from server.tools.demo import (
    DEMO_MODELS,
    PEAK_SHARE,
    POOL,
    REQUESTS_PER_FREE_CORE,
    WORKERS,
)
from server.tools.processes import torch_threads_env
from simulations.calibration import performance_table
from simulations.traces import Trace, load_trace
from tidal_base.errors import InvalidInput

DEMO_SLO_S = 0.1  # the controller's default SLO, which the demo keeps
LEAD_IN_S = 3.0
"""From the pool ready to the replay's zero: the day opens with the midnight sale, and a
controller that knows of it gets a few ticks to warm for it."""


@dataclass(frozen=True)
class Sizing:
    """How the demo fits the machine: torch threads per worker, and the replay's peak."""

    cores: int
    free_cores: float  # idle over a second before the demo started
    threads_per_worker: int
    capacity_rps: float  # what the latency model serves within the SLO on the workers
    peak_rps: float
    latency_model: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "free_cores": round(self.free_cores, 2),
            "threads_per_worker": self.threads_per_worker,
            "capacity_rps": round(self.capacity_rps, 1),
            "peak_rps": round(self.peak_rps, 1),
            "latency_model": self.latency_model,
        }


def run_demo(args: argparse.Namespace) -> int:
    trace, events = _check(args)  # every flag, before anything starts
    work = Path(tempfile.mkdtemp(prefix="tidal-demo-"))  # mode 0700: it holds the token
    controller = None
    try:
        trace, trace_path, events = _materialise(args, trace, events, work)
        sizing = _size(args, work)
        say = _printer(args.json)
        say(
            f"tidal demo: {sizing.cores} cores ({sizing.free_cores:.1f} idle), "
            f"{sizing.threads_per_worker} torch thread(s) per worker; the model serves "
            f"{sizing.capacity_rps:,.0f} req/s within the {DEMO_SLO_S * 1e3:.0f} ms SLO on "
            f"{WORKERS} workers by its profile; replaying up to {sizing.peak_rps:.0f} req/s"
        )
        for warning in _warnings(args, sizing):
            print(f"tidal demo: warning: {warning}", file=sys.stderr, flush=True)
        token = secrets.token_urlsafe(24)
        (work / "token").write_text(token)
        api = f"http://127.0.0.1:{args.port}"
        controller = _start_controller(args, sizing, work)
        wait_ready(api, controller, work / "controller.log")
        start_at = time.time() + LEAD_IN_S
        shifted = rescale_events(events, epoch_seconds(trace.origin), args.time_scale, start_at)
        _declare(api, token, shifted)
        if not args.json:
            _print_guide(api, work, args, trace_path, sizing, len(shifted))
        _replay(args, trace, trace_path, sizing, start_at, work)
        outcome = _outcome(api, work / "requests.csv", shifted, start_at, sizing)
        print(json.dumps(outcome) if args.json else format_outcome(outcome), flush=True)
        if args.keep_running:
            print("still serving; Ctrl-C to stop", file=sys.stderr, flush=True)
            controller.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if controller is not None:
            _stop(controller)
        if args.keep_files:
            print(f"tidal demo: kept {work}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _check(args: argparse.Namespace) -> tuple[Trace | None, tuple[Event, ...]]:
    """Every flag checked before any work: a typo fails in the first second, not after a
    profile of 15 s. Returns the trace (None: the generated day) and its events."""
    if args.duration is not None and args.duration <= 0:
        raise InvalidInput(
            f"--duration must be > 0 (leave it out to replay the whole day), got {args.duration:g}s"
        )
    _check_policy(args.policy)
    if args.latency_model:
        parse_latency_model(args.latency_model)
    _check_model(args.model)
    for port in (args.port, args.port + 1, args.port + 2):
        check_free("127.0.0.1", port, "--port (the API, then its two workers)")
    trace = load_trace(args.trace) if args.trace is not None else None
    events_path = args.events
    if events_path is None and args.trace is not None:
        sibling = args.trace.with_name(args.trace.name.removesuffix(".csv") + ".events.yaml")
        events_path = sibling if sibling.exists() else None
    events = load_events(events_path) if events_path is not None else ()
    return trace, events


def _check_policy(text: str) -> None:
    spec = parse_policy_spec(text)
    kind = POLICY_KINDS.get(spec.name)
    if kind is None or spec.name == "oracle":
        live = ", ".join(k for k in POLICY_KINDS if k != "oracle")
        raise InvalidInput(f"--policy: unknown policy {spec.name!r} in {text!r} (known: {live})")
    kind.check(spec)


def _check_model(spec: str) -> None:
    """The model's name or file, without loading torch (the workers load it)."""
    if spec in DEMO_MODELS or Path(spec).exists() or ":" in spec:
        return
    raise InvalidInput(
        f"--model: unknown model {spec!r}: use {', '.join(DEMO_MODELS)}, a TorchScript path "
        "or module:factory"
    )


def _materialise(
    args: argparse.Namespace, trace: Trace | None, events: tuple[Event, ...], work: Path
) -> tuple[Trace, Path, tuple[Event, ...]]:
    """The trace and the file the load generator reads: the user's, or the promotion day
    written into the working folder with its sales (found wherever the demo runs)."""
    if trace is not None:
        return trace, args.trace, events
    from simulations.promo_day import PromoDaySpec, generate_promo_day
    from simulations.trace_cli import events_yaml, write_counts_csv

    day = generate_promo_day(PromoDaySpec())
    path = work / "promo_day.csv"
    write_counts_csv(day, path)
    (work / "promo_day.events.yaml").write_text(events_yaml(day))
    if args.events is None:
        events = load_events(work / "promo_day.events.yaml")
    return load_trace(path), path, events


def _size(args: argparse.Namespace, work: Path) -> Sizing:
    cores = len(os.sched_getaffinity(0))
    free = min(float(cores), free_cores(cores))
    threads = max(1, cores // WORKERS)
    latency = args.latency_model or _profile(args.model, work, threads, args.json)
    capacity = capacity_rps(parse_latency_model(latency), WORKERS, DEMO_SLO_S)
    peak = args.peak_rps
    if peak is None:
        peak = min(PEAK_SHARE * capacity, REQUESTS_PER_FREE_CORE * max(free, 0.25))
    return Sizing(cores, free, threads, capacity, peak, latency)


def free_cores(cores: int, sample_s: float = 1.0) -> float:
    """The cores other work leaves idle, over `sample_s` (/proc/stat: idle and iowait
    over all time spent); all of them where /proc/stat cannot be read."""
    first = _cpu_times()
    time.sleep(sample_s)
    second = _cpu_times()
    if first is None or second is None:
        return float(cores)
    busy = second[0] - first[0]
    idle = second[1] - first[1]
    return cores * idle / (busy + idle) if busy + idle > 0 else float(cores)


def _cpu_times() -> tuple[int, int] | None:
    """(busy, idle) jiffies of all CPUs together, from /proc/stat's first line."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields[:8]) - idle, idle


def capacity_rps(latency: LatencyModel, workers: int, slo_s: float) -> float:
    """The most any config serves within the SLO by the planner's own table."""
    optimizer = ConfigOptimizer(performance_table(latency, workers, slo_s, padded=False), slo_s)
    return max(optimizer.capacity_rps(int(cap)) for cap in np.unique(optimizer.table.caps))


def _warnings(args: argparse.Namespace, sizing: Sizing) -> list[str]:
    if sizing.capacity_rps <= 0:
        return [
            f"the latency model ({sizing.latency_model}) serves no load within the SLO of "
            f"{DEMO_SLO_S * 1e3:.0f} ms: the controller will say no config meets it"
        ]
    if sizing.peak_rps > sizing.capacity_rps:
        return [
            f"--peak-rps {sizing.peak_rps:g} is above the {sizing.capacity_rps:.0f} req/s the "
            f"latency model serves within the SLO on {WORKERS} workers: expect misses at the "
            "sales"
        ]
    return []


def _profile(model: str, work: Path, threads: int, quiet: bool) -> str:
    """Profile the model as the workers will run it: one profile per worker at once, each
    on its share of the cores, so what the machine is doing besides shows in the times;
    the slower of the two at each size is the planner's."""
    if not quiet:
        print(f"profiling {model} as {WORKERS} workers run it (about 15 s) ...", flush=True)
    outs = [work / f"profile-{i}.json" for i in range(WORKERS)]
    runs = [_start_profile(model, out, threads) for out in outs]
    for run in runs:
        if run.wait() != 0:
            raise InvalidInput(f"tidal profile --model {model} failed (exit {run.returncode})")
    merged = slowest_profile([json.loads(out.read_text()) for out in outs])
    path = work / "profile.json"
    path.write_text(json.dumps(merged, indent=2))
    return str(path)


def _start_profile(model: str, out: Path, threads: int) -> subprocess.Popen:
    # --no-compile: the controller's local workers run the model eager, whatever its
    # default, so the profile measures that (and skips a compile per size).
    return subprocess.Popen(
        [
            sys.executable, "-m", "server.cli", "profile", "--model", model,
            "--batch-sizes", "1,2,4,8,16,32,64,128", "--runs", "10", "--out", str(out),
            "--no-compile",
        ],
        stdout=subprocess.DEVNULL,
        env=torch_threads_env(threads),
    )  # fmt: skip


def slowest_profile(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Profiles of the same sizes taken side by side, merged size by size into the slower
    mean and p99 (what a worker sees while the other is busy too)."""
    first = documents[0]
    points = []
    for i, point in enumerate(first["points"]):
        same = [d["points"][i] for d in documents]
        points.append(
            {
                "batch_size": point["batch_size"],
                "mean_ms": max(p["mean_ms"] for p in same),
                "p99_ms": max(p["p99_ms"] for p in same),
            }
        )
    return {**first, "points": points, "source": f"{len(documents)} profiles side by side"}


def _start_controller(args: argparse.Namespace, sizing: Sizing, work: Path) -> subprocess.Popen:
    log = (work / "controller.log").open("w")
    return subprocess.Popen(
        [
            sys.executable, "-m", "server.cli", "controller", "--redis", "none",
            "--pool", POOL, "--policy", args.policy, "--workers", str(WORKERS),
            "--slo", f"{DEMO_SLO_S * 1e3:g}ms", "--latency-model", sizing.latency_model,
            "--token-file", str(work / "token"), "--port", str(args.port),
            "--local-workers", str(WORKERS), "--model", args.model,
            "--worker-port", str(args.port + 1),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=torch_threads_env(sizing.threads_per_worker),
    )  # fmt: skip


def _declare(api: str, token: str, events: tuple[Event, ...]) -> None:
    """The sales, declared as an operator would: through the API, with the write token."""
    if not events:
        return
    answer = httpx.post(
        f"{api}/v1/pools/{POOL}/events",
        json={"events": [event_to_dict(e) for e in events]},
        headers={"authorization": f"Bearer {token}"},
        timeout=10,
    )
    if answer.status_code != 200:
        raise InvalidInput(f"declaring the events failed: {answer.json().get('error')}")


def _replay(
    args: argparse.Namespace,
    trace: Trace,
    trace_path: Path,
    sizing: Sizing,
    start_at: float,
    work: Path,
) -> None:
    recorded_peak = float(trace.counts.max() / trace.step_s)
    rate_scale = sizing.peak_rps / (recorded_peak * args.time_scale)
    workers = ",".join(f"http://127.0.0.1:{args.port + i}" for i in (1, 2))
    replay = [
        "loadgen", "--trace", str(trace_path), "--target", workers, "--model", args.model,
        "--time-scale", str(args.time_scale), "--rate-scale", repr(rate_scale),
        "--start-at", repr(start_at), "--out", str(work / "requests.csv"), "--json",
        "--max-failed", "1",  # the outcome is shown below, whatever failed
    ]  # fmt: skip
    if args.duration:
        replay += ["--duration", f"{args.duration}s"]
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", *replay],
        stdout=subprocess.DEVNULL,
        env=torch_threads_env(1),
        check=False,
    )
    if done.returncode != 0:
        raise InvalidInput(f"tidal loadgen failed (exit {done.returncode})")


def wait_ready(api: str, process: subprocess.Popen, log: Path, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
            raise InvalidInput(f"the controller exited ({tail[0]})")
        try:
            if httpx.get(f"{api}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise InvalidInput(f"the controller was not ready within {timeout_s:.0f} s (see {log})")


def _printer(quiet: bool):
    def say(line: str) -> None:
        print(line, file=sys.stderr if quiet else sys.stdout, flush=True)

    return say


def _print_guide(
    api: str, work: Path, args: argparse.Namespace, trace: Path, sizing: Sizing, events: int
) -> None:
    day_s = 86_400 / args.time_scale
    workers = [f"http://127.0.0.1:{args.port + i}" for i in (1, 2)]
    kept = "kept at exit (--keep-files)" if args.keep_files else "removed at exit"
    print(
        f"""
replaying {trace.name} ({events} declared events), 24 h in {day_s:.0f} s, peak \
{sizing.peak_rps:.0f} req/s

  pool         {api}/v1/pools/{POOL}
  console      {api}/ui
  decisions    {api}/v1/pools/{POOL}/decisions
  forecast     {api}/v1/pools/{POOL}/forecast
  workers      {api}/v1/pools/{POOL}/workers
  API docs     {api}/docs
  metrics      {api}/metrics  {"  ".join(w + "/metrics" for w in workers)}
  writes       curl -H "Authorization: Bearer $(cat {work}/token)" -X PUT ...
  logs         {work}/controller.log ({kept})
""",
        flush=True,
    )


def _outcome(
    api: str, requests_csv: Path, events: tuple[Event, ...], start_at: float, sizing: Sizing
) -> dict[str, Any]:
    pool = httpx.get(f"{api}/v1/pools/{POOL}", timeout=5).json()
    records = httpx.get(
        f"{api}/v1/pools/{POOL}/decisions", params={"limit": 10_000}, timeout=5
    ).json()["decisions"]
    return {
        **served(requests_csv, DEMO_SLO_S),
        **decisions_summary(records),
        "config_now": pool["config"],
        "version": pool["version"],
        "before_each_sale": warm_ups_before(records, events, start_at),
        "sizing": sizing.to_dict(),
    }


def served(requests_csv: Path, slo_s: float) -> dict[str, Any]:
    """What clients saw: every request sent, answered or not, against the SLO."""
    with requests_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    statuses = collections.Counter(int(r["status"]) for r in rows)
    ok = np.array([float(r["latency_s"]) for r in rows if r["status"] == "200"])
    within = int(np.count_nonzero(ok <= slo_s))
    quantile = (lambda q: round(float(np.quantile(ok, q)) * 1e3, 1)) if ok.size else None
    return {
        "slo_ms": round(slo_s * 1e3, 3),
        "requests": len(rows),
        "by_status": {str(s): n for s, n in sorted(statuses.items())},
        "p50_ms": quantile(0.5) if quantile else None,
        "p99_ms": quantile(0.99) if quantile else None,
        # Of every request sent: a shed, failed or late one is a miss.
        "slo_attainment": round(within / len(rows), 5) if rows else None,
    }


def decisions_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Every recorded decision counted once: those that changed the config by kind, and
    the rest (held, guarded without a change, fallback) by kind, so the counts add up."""
    changed = collections.Counter(r["kind"] for r in records if _changed(r))
    other = collections.Counter(r["kind"] for r in records if not _changed(r))
    return {
        "decisions": len(records),
        "config_changes": dict(changed.most_common()),
        "other_decisions": dict(other.most_common()),
    }


def _changed(record: dict[str, Any]) -> bool:
    return record["chosen"] != record["previous"]


def warm_ups_before(
    records: list[dict[str, Any]], events: tuple[Event, ...], start_at: float
) -> list[dict[str, Any]]:
    """For each declared sale, the decisions that raised the warm target after the one
    before ended and before this one began: how far ahead the controller prepared."""
    result = []
    since = float("-inf")
    for event in sorted(events, key=lambda e: e.start_s):
        ahead = [
            {
                "lead_s": round(event.start_s - r["time"], 2),
                "kind": r["kind"],
                "warm_max_batch": r["chosen"]["warm_max_batch"],
                "reason": r["reason"],
            }
            for r in records
            if since <= r["time"] < event.start_s
            and r["chosen"]["warm_max_batch"] > r["previous"]["warm_max_batch"]
        ]
        result.append(
            {"sale": event.name, "at_s": round(event.start_s - start_at, 2), "warm_ups": ahead}
        )
        since = event.end_s
    return result


def format_outcome(outcome: dict[str, Any]) -> str:
    """The outcome as a person reads it (the JSON says the same)."""
    slo = outcome["slo_ms"]
    statuses = ", ".join(f"{n:,} {_status(s)}" for s, n in outcome["by_status"].items())
    changes, other = outcome["config_changes"], outcome["other_decisions"]
    config = outcome["config_now"]
    lines = [
        "",
        f"clients: {outcome['requests']:,} requests ({statuses})",
        f"  latency p50 {outcome['p50_ms']} ms, p99 {outcome['p99_ms']} ms; "
        f"{_percent(outcome['slo_attainment'])} within the {slo:g} ms SLO",
        f"controller: {outcome['decisions']} decisions recorded: "
        f"{sum(changes.values())} config changes ({_counts(changes)}), "
        f"{sum(other.values())} without a change ({_counts(other)})",
        f"  now batch {config['max_batch']}, timeout {config['timeout_ms']:g} ms "
        f"(config v{outcome['version']})",
    ]
    for sale in outcome["before_each_sale"]:
        lines.append(f"before {sale['sale']} (at +{sale['at_s']:.0f} s): " + _warmed(sale))
    return "\n".join(lines)


def _warmed(sale: dict[str, Any]) -> str:
    if not sale["warm_ups"]:
        return "no warm-up started"
    first = max(sale["warm_ups"], key=lambda w: w["lead_s"])
    top = max(w["warm_max_batch"] for w in sale["warm_ups"])
    return (
        f"{len(sale['warm_ups'])} warm-up(s), the first {first['lead_s']:.1f} s ahead "
        f"({first['kind']}), up to batch {top}: {first['reason']}"
    )


def _status(status: str) -> str:
    names = {"200": "answered", "429": "shed", "504": "expired", "0": "not sent", "-1": "lost"}
    return f"{names.get(status, 'HTTP')} ({status})" if status in names else f"HTTP {status}"


def _counts(counter: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in counter.items()) or "none"


def _percent(fraction: float | None) -> str:
    return "n/a" if fraction is None else f"{fraction * 100:.2f}%"


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
