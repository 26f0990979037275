"""`tidal demo`: a newcomer's first live run, on one machine, no Redis.

It profiles the demo model (the planner's latency model; `--latency-model` reuses one),
starts `tidal controller --redis none` hosting two workers, declares the flash sales
through the operator API once the pool is ready (shifted onto the replay's clock),
replays a promotion day time-compressed against them with `tidal loadgen`, prints where
to look while it runs, and ends with what the controller did and why.
"""

from __future__ import annotations

import argparse
import collections
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from adaptive.latency import LatencyModel, parse_latency_model
from adaptive.optimizer import ConfigOptimizer
from forecaster.events import event_to_dict, load_events, rescale_events
from forecaster.series import epoch_seconds
from server.ports import check_free
from simulations.calibration import performance_table
from simulations.cli import duration_arg, positive_float_arg
from simulations.traces import load_trace
from tidal_base.errors import InvalidInput

DEFAULT_TRACE = Path("examples/promo_day.csv")
POOL = "demo"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo", help="controller + 2 workers + load generator on a compressed promo day"
    )
    demo.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace to replay")
    demo.add_argument(
        "--events", type=Path, help="declared events (default: the trace's .events.yaml)"
    )
    demo.add_argument(
        "--time-scale", type=positive_float_arg, default=360.0, help="compression (default 360)"
    )
    demo.add_argument(
        "--peak-rps", type=positive_float_arg, default=160.0, help="replayed peak (default 160)"
    )
    demo.add_argument("--duration", type=duration_arg, help="stop the replay after this long")
    demo.add_argument("--policy", default="predictive", help="the controller's policy")
    demo.add_argument("--model", default="demo-cnn")
    demo.add_argument(
        "--latency-model",
        help="the planner's latency model (a profile JSON or linear:BASE_MS,PER_ITEM_MS); "
        "default: profile --model first (about 15 s)",
    )
    demo.add_argument("--port", type=int, default=8000, help="API port; workers take the next two")
    demo.add_argument(
        "--keep-running", action="store_true", help="keep serving after the replay (Ctrl-C ends)"
    )
    demo.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    trace = load_trace(args.trace)  # a bad trace fails here, before anything starts
    if args.latency_model:
        parse_latency_model(args.latency_model)  # and a bad latency model
    for port in (args.port, args.port + 1, args.port + 2):  # before a profile of 15 s
        check_free("127.0.0.1", port, "--port (the API, then its two workers)")
    events_path = args.events or args.trace.with_suffix(".events.yaml")
    events = load_events(events_path) if events_path.exists() else ()
    peak_rps = float(trace.counts.max() / trace.step_s)
    rate_scale = args.peak_rps / (peak_rps * args.time_scale)
    work = Path(tempfile.mkdtemp(prefix="tidal-demo-"))
    api = f"http://127.0.0.1:{args.port}"
    workers = [f"http://127.0.0.1:{args.port + i}" for i in (1, 2)]
    print(f"tidal demo: working in {work}", flush=True)
    latency_model = args.latency_model or _profile(args.model, work)
    warning = slo_warning(parse_latency_model(latency_model), 2, DEMO_SLO_S, args.peak_rps)
    if warning is not None:
        print(f"tidal demo: warning: {warning}", flush=True)
    token = secrets.token_urlsafe(24)
    (work / "token").write_text(token)
    log = (work / "controller.log").open("w")
    controller = start_tidal(
        [
            "controller", "--redis", "none", "--pool", POOL, "--policy", args.policy,
            "--workers", "2", "--latency-model", latency_model,
            "--token-file", str(work / "token"),
            "--port", str(args.port), "--local-workers", "2", "--model", args.model,
            "--worker-port", str(args.port + 1),
        ],
        log,
    )  # fmt: skip
    try:
        wait_ready(api, controller, work / "controller.log")
        start_at = time.time() + 2.0  # the replay's zero, a moment after the pool is ready
        shifted = rescale_events(events, epoch_seconds(trace.origin), args.time_scale, start_at)
        _declare(api, token, shifted)
        _print_guide(api, workers, work, args, len(shifted))
        replay = [
            "loadgen", "--trace", str(args.trace), "--target", ",".join(workers),
            "--model", args.model, "--time-scale", str(args.time_scale),
            "--rate-scale", repr(rate_scale), "--start-at", repr(start_at),
            "--out", str(work / "requests.csv"),
            "--max-failed", "1",  # the outcome is shown below, whatever failed
        ]  # fmt: skip
        if args.duration:
            replay += ["--duration", f"{args.duration}s"]
        run_tidal(*replay)
        _print_outcome(api)
        if args.keep_running:
            print("still serving; Ctrl-C to stop", flush=True)
            controller.wait()
    except KeyboardInterrupt:
        pass
    finally:
        _stop(controller)
    return 0


DEMO_SLO_S = 0.1  # the controller's default SLO, which the demo keeps


def slo_warning(latency: LatencyModel, workers: int, slo_s: float, peak_rps: float) -> str | None:
    """Why the planner will find no config that meets the SLO at the replay's peak, or
    None: the most any config serves within it, by the planner's own table (found live:
    a profile taken on a busy machine made the demo change config every second)."""
    optimizer = ConfigOptimizer(performance_table(latency, workers, slo_s, padded=False), slo_s)
    best_rps = max(optimizer.capacity_rps(int(cap)) for cap in np.unique(optimizer.table.caps))
    if peak_rps <= best_rps:
        return None
    return (
        f"the latency model ({latency.describe()}) serves at most {best_rps:.0f} req/s within "
        f"the SLO of {slo_s * 1e3:.0f} ms on {workers} workers, and the replay peaks at "
        f"{peak_rps:.0f} req/s: the controller will say no config meets the SLO; lower "
        "--peak-rps or profile on a quieter machine"
    )


def _profile(model: str, work: Path) -> str:
    print(f"profiling {model} (the planner's latency model) ...", flush=True)
    run_tidal(
        "profile", "--model", model, "--batch-sizes", "1,2,4,8,16,32,64",
        "--runs", "10", "--out", str(work / "profile.json"), quiet=True,
    )  # fmt: skip
    return str(work / "profile.json")


def _declare(api: str, token: str, events) -> None:
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


def run_tidal(*argv: str, quiet: bool = False) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", *argv],
        stdout=subprocess.DEVNULL if quiet else None,
        check=False,
    )
    if done.returncode != 0:
        raise InvalidInput(f"tidal {argv[0]} failed (exit {done.returncode})")


def start_tidal(argv: list[str], log) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "server.cli", *argv], stdout=log, stderr=subprocess.STDOUT
    )


def wait_ready(api: str, process: subprocess.Popen, log: Path, timeout_s: float = 60) -> None:
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


def _print_guide(api: str, workers: list[str], work: Path, args, events: int) -> None:
    day_s, peak = 86_400 / args.time_scale, args.peak_rps
    print(
        f"""
replaying {args.trace} ({events} declared events), 24 h in {day_s:.0f} s, peak {peak:.0f} req/s

  pool         {api}/v1/pools/{POOL}
  decisions    {api}/v1/pools/{POOL}/decisions
  forecast     {api}/v1/pools/{POOL}/forecast
  workers      {api}/v1/pools/{POOL}/workers
  API docs     {api}/docs
  metrics      {api}/metrics  {"  ".join(w + "/metrics" for w in workers)}
  writes       curl -H "Authorization: Bearer $(cat {work}/token)" -X PUT ...
  logs         {work}/controller.log
""",
        flush=True,
    )


def _print_outcome(api: str) -> None:
    pool = httpx.get(f"{api}/v1/pools/{POOL}", timeout=5).json()
    records = httpx.get(
        f"{api}/v1/pools/{POOL}/decisions", params={"limit": 10_000}, timeout=5
    ).json()["decisions"]
    kinds = collections.Counter(r["kind"] for r in records)
    print(
        f"\ncontroller: {pool['config_changes']} config changes "
        f"({', '.join(f'{k} {n}' for k, n in kinds.most_common())}); "
        f"now {pool['config']} v{pool['version']}"
    )
    for record in [r for r in records if r["kind"] in {"scale_up", "warm_ahead"}][:3]:
        stamp = time.strftime("%H:%M:%S", time.localtime(record["time"]))
        print(f"  {stamp} {record['kind']}: {record['reason']}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
