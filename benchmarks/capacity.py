"""Capacity: replicas and batches planned together, against the autoscalers users run.

On the promotion day (examples/promo_day.csv, its sales declared), SLO p99 100 ms,
warm-up 20 s per bucket, replica start-up 90 s, latency linear:5,0.4 ms, one fleet that
may scale between 1 and 40 replicas, the same for every policy:

- `predictive:replicas=plan` (Tidal's joint policy) and `oracle:replicas=plan` (the same
  planner knowing the recorded future);
- `serve-autoscaler` (Ray Serve's default autoscaling policy) and `hpa` (a Kubernetes
  HPA on utilisation, target 60%), each over a static `max_batch=32, 10 ms` (the best
  static config on this day at a fleet of 11, docs/benchmarks.md) with Serve's target
  of ongoing requests set to that cap, so that a replica can fill its batches (Serve's
  default target of 2 would cap batches at 2);
- a static fleet sized for the day's peak: the most replicas the oracle ever asked
  for, fixed all day, on the same static config.

Every scaling fleet starts at the size the day's first minutes need (the oracle's count
at its first decision), since the day opens with its midnight sale and a replica takes
about 4 minutes to serve. Figures per policy: replica-hours provisioned, SLO attainment
over the day and its worst 10 minutes, requests over the SLO inside the declared sales,
p99, replica changes; then the issue's targets, met or missed. `--taxi PATH` adds the
NYC taxi trace (real, 30-minute counts; no events declared), its first `--taxi-days`
days, its rate scaled so that its peak needs several replicas.

    PYTHONPATH=. python benchmarks/capacity.py [--taxi ../shared/traces/nyc_taxi.csv]

Prints readable tables; the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

# The same count as the policy-gains benchmark: requests over the SLO (or shed) in
# timeline windows that overlap a declared sale (this folder is on sys.path).
from policy_gains import spike_violations

from adaptive.fleet import FleetLimits
from adaptive.latency import parse_latency_model
from adaptive.specs import build_policy
from forecaster.events import Event, load_events
from forecaster.series import epoch_seconds
from simulations.cli import policy_context
from simulations.engine import PoolSettings
from simulations.run import PolicyResult, SimulationReport, SimulationSettings, simulate
from simulations.traces import Trace, load_trace

ROOT = Path(__file__).resolve().parents[1]
PROMO = ROOT / "examples" / "promo_day.csv"
EVENTS = ROOT / "examples" / "promo_day.events.yaml"
SLO_S = 0.1
WARMUP_S = 20.0
STARTUP_S = 90.0
LATENCY = "linear:5,0.4"
MAX_REPLICAS = 40
STATIC = "max_batch=32,timeout=10ms"
JOINT = "predictive:replicas=plan"
ORACLE = "oracle:replicas=plan"
SERVE = f"serve-autoscaler:{STATIC},target_ongoing=32"
HPA = f"hpa:{STATIC},target=0.6"


def run(
    trace: Trace,
    specs: tuple[str, ...],
    events: tuple[Event, ...],
    workers: int,
    fleet: FleetLimits | None,
    tick_s: float = 1.0,
) -> SimulationReport:
    latency = parse_latency_model(LATENCY)
    pool = PoolSettings(workers, SLO_S, warmup_s=WARMUP_S, fleet=fleet)
    settings = SimulationSettings(
        pool=pool,
        tick_s=tick_s,
        window_s=10 * tick_s,
        events=events,
        origin_s=epoch_seconds(trace.origin),
    )
    context = policy_context(trace, latency, pool)
    return simulate(trace, [build_policy(s, context) for s in specs], settings, latency)


def figures(result: PolicyResult, events: tuple[Event, ...], origin_s: float) -> dict:
    p99 = result.latency.p99_s
    return {
        "replica_hours": round(result.replica_seconds / 3600, 3),
        "max_replicas": result.max_replicas,
        "replica_changes": result.replica_changes,
        "slo_attainment": round(result.slo_attainment, 6),
        "slo_attainment_worst_10min": round(result.worst_window_attainment(600.0), 6),
        "sale_violations": spike_violations(result, events, origin_s),
        "p99_ms": None if p99 is None else round(p99 * 1e3, 2),
        "busy_seconds_per_1k": round(result.busy_seconds_per_1k, 5),
        "wall_s": round(result.wall_s, 1),
    }


def opening_size(trace: Trace, events: tuple[Event, ...]) -> tuple[int, int]:
    """(the oracle's replicas at its first decision, the most it ever asked for): a
    short oracle run for the first, the whole day for the second."""
    fleet = FleetLimits(1, MAX_REPLICAS, STARTUP_S)
    report = run(trace, (ORACLE,), events, MAX_REPLICAS, fleet)
    asked = [d.replicas for d in report.results[0].decisions if d.replicas is not None]
    return asked[0], max(asked[1:], default=asked[0])  # the start at 40 is not a peak


def compare(trace: Trace, events: tuple[Event, ...], tick_s: float) -> dict[str, dict]:
    origin_s = epoch_seconds(trace.origin)
    opening, peak = opening_size(trace, events)
    fleet = FleetLimits(1, MAX_REPLICAS, STARTUP_S)
    scaling = run(trace, (JOINT, ORACLE, SERVE, HPA), events, opening, fleet, tick_s)
    fixed = run(trace, (f"static:{STATIC}",), events, peak, None, tick_s)
    rows = {r.policy: figures(r, events, origin_s) for r in scaling.results}
    rows[f"static fleet of {peak} (the peak)"] = figures(fixed.results[0], events, origin_s)
    rows["_opening_replicas"] = {"replicas": opening}
    return rows


def targets(rows: dict[str, dict]) -> dict[str, dict]:
    joint, oracle = rows[JOINT], rows[ORACLE]
    static = next(v for k, v in rows.items() if k.startswith("static fleet"))
    serve, hpa = rows[SERVE], rows[HPA]

    def fewer(than: dict) -> float:
        return round(1 - joint["replica_hours"] / than["replica_hours"], 4)

    def ratio(peer: dict) -> float:
        return round(peer["sale_violations"] / max(joint["sale_violations"], 1), 2)

    out = {
        "holds_slo_worst_10min": {
            "value": joint["slo_attainment_worst_10min"],
            "target": ">= 0.99",
            "met": joint["slo_attainment_worst_10min"] >= 0.99,
        },
        "fewer_replica_hours_than_static_peak": {
            "value": fewer(static),
            "target": ">= 0.30 at equal or better SLO",
            "met": fewer(static) >= 0.30 and joint["slo_attainment"] >= static["slo_attainment"],
        },
        "fewer_replica_hours_than_serve_autoscaler": {
            "value": fewer(serve),
            "target": ">= 0.15 at equal or better SLO",
            "met": fewer(serve) >= 0.15 and joint["slo_attainment"] >= serve["slo_attainment"],
        },
        "sale_violations_ratio_vs_serve_autoscaler": {
            "value": ratio(serve),
            "target": ">= 5",
            "met": ratio(serve) >= 5,
        },
        "sale_violations_ratio_vs_hpa": {
            "value": ratio(hpa),
            "target": ">= 5",
            "met": ratio(hpa) >= 5,
        },
        "replica_hours_over_oracle": {
            "value": round(joint["replica_hours"] / oracle["replica_hours"] - 1, 4),
            "target": "<= 0.05",
            "met": joint["replica_hours"] <= 1.05 * oracle["replica_hours"],
        },
    }
    return out


def print_table(title: str, rows: dict[str, dict]) -> None:
    print(f"\n{title}")
    header = (
        f"{'policy':<52} {'rep-h':>8} {'max':>4} {'moves':>5} {'SLO %':>7} {'worst10m':>8} "
        f"{'sale viol':>10} {'p99 ms':>10}"
    )
    print(header)
    print("-" * len(header))
    for name, f in rows.items():
        if name.startswith("_"):
            continue
        p99 = "-" if f["p99_ms"] is None else f"{f['p99_ms']:.1f}"
        print(
            f"{name:<52} {f['replica_hours']:>8.2f} {f['max_replicas']:>4} "
            f"{f['replica_changes']:>5} {f['slo_attainment'] * 100:>7.2f} "
            f"{f['slo_attainment_worst_10min'] * 100:>8.2f} {f['sale_violations']:>10} {p99:>10}"
        )


def taxi_trace(path: Path, days: float, scale: float) -> Trace:
    """The first `days` of the taxi trace, rate scaled, written where simulate reads it."""
    lines = path.read_text().splitlines()
    keep = lines[: 1 + int(days * 48)]  # 30-minute intervals
    folder = Path(tempfile.mkdtemp(prefix="tidal-capacity-"))
    subset = folder / f"nyc_taxi_{days:g}d.csv"
    subset.write_text("\n".join(keep) + "\n")
    return load_trace(subset, rate_scale=scale)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--taxi", type=Path, help="the NYC taxi trace (30-minute counts)")
    parser.add_argument("--taxi-days", type=float, default=3.0)
    parser.add_argument("--taxi-scale", type=float, default=800.0)
    args = parser.parse_args()
    if args.taxi is not None and not args.taxi.is_file():
        parser.error(f"--taxi {args.taxi}: no such file")
    if not 0 < args.taxi_days <= 30 or not 0 < args.taxi_scale <= 1e5:
        parser.error("--taxi-days must be in (0, 30] and --taxi-scale in (0, 1e5]")
    started = time.perf_counter()
    events = load_events(EVENTS)
    promo = compare(load_trace(PROMO), events, tick_s=1.0)
    print_table("promotion day (sales declared)", promo)
    met = targets(promo)
    print("\ntargets")
    for name, t in met.items():
        verdict = "met" if t["met"] else "MISSED"
        print(f"  {name:<45} {t['value']!s:>8}  target {t['target']:<32} {verdict}")
    out: dict = {"promo_day": promo, "targets": met}
    if args.taxi is not None:
        taxi = compare(taxi_trace(args.taxi, args.taxi_days, args.taxi_scale), (), tick_s=5.0)
        print_table(
            f"NYC taxi, first {args.taxi_days:g} days x{args.taxi_scale:g} (no events)", taxi
        )
        out["nyc_taxi"] = taxi
    out["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
