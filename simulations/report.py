"""Present a simulation: the comparison table, the summary JSON and the timeline CSVs."""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from simulations.run import PolicyResult, SimulationReport


def _ms(value_s: float | None) -> float | None:
    return None if value_s is None else round(value_s * 1e3, 4)


def policy_summary(result: PolicyResult) -> dict[str, Any]:
    """One policy's entry in the summary JSON (schema in docs/simulate.md)."""
    latency = result.latency
    return {
        "policy": result.policy,
        "completed": result.completed,
        "shed": result.shed,
        "throughput_rps": round(result.throughput_rps, 3),
        "latency_ms": {
            "p50": _ms(latency.p50_s),
            "p90": _ms(latency.p90_s),
            "p99": _ms(latency.p99_s),
            "p999": _ms(latency.p999_s),
            "max": _ms(latency.max_s),
            "mean": _ms(latency.mean_s),
        },
        "slo_attainment": round(result.slo_attainment, 6),
        **_client_summary(result),
        "slo_attainment_worst_10min": round(result.worst_window_attainment(600.0), 6),
        "mean_batch_size": round(result.mean_batch_size, 4),
        "batch_fill_ratio": round(result.batch_fill_ratio, 4),
        "utilization": round(result.utilization, 4),
        "busy_seconds": round(result.busy_s, 4),
        "busy_seconds_per_1k": round(result.busy_seconds_per_1k, 6),
        "wall_s": round(result.wall_s, 3),
        "sim_requests_per_s": round(result.sim_requests_per_s),
        "config_changes": result.config_changes,
        "replica_seconds": round(result.replica_seconds, 3),
        "max_replicas": result.max_replicas,
        "replica_changes": result.replica_changes,
        "fallback_s": round(result.fallback_s, 3),
        "forecast_fit_failures": result.fit_failures,
        "clamped_max_batch": (
            {"requested": result.clamped_from, "applied": result.max_feasible_batch}
            if result.clamped_from
            else None
        ),
    }


def _client_summary(result: PolicyResult) -> dict[str, Any]:
    """What clients see, when the latency model carries the overhead outside the batcher."""
    client = result.client_latency
    if client is None or result.client_slo_attainment is None:
        return {}
    return {
        "client_latency_ms": {
            "p50": _ms(client.p50_s),
            "p90": _ms(client.p90_s),
            "p99": _ms(client.p99_s),
            "p999": _ms(client.p999_s),
            "max": _ms(client.max_s),
            "mean": _ms(client.mean_s),
        },
        "client_slo_attainment": round(result.client_slo_attainment, 6),
    }


def summary_dict(report: SimulationReport) -> dict[str, Any]:
    return {
        "trace": report.trace,
        "requests": report.requests,
        "workers": report.workers,
        "slo_ms": round(report.slo_s * 1e3, 6),
        "latency_model": report.latency_model,
        "tick_s": report.tick_s,
        "window_s": report.window_s,
        "policies": [policy_summary(r) for r in report.results],
        **({"client_overhead": report.client_overhead} if report.client_overhead else {}),
        "notes": list(report_notes(report)),
    }


def report_notes(report: SimulationReport) -> list[str]:
    """Things the reader must know to trust the table: clamps, safety sheds, input fixes."""
    notes = list(report.notes)
    for r in report.results:
        if r.clamped_from:
            notes.append(
                f"{r.policy}: max batch {r.clamped_from} exceeds the memory limit; "
                f"ran with {r.max_feasible_batch}"
            )
        if r.safety_shed:
            notes.append(
                f"{r.policy}: queue passed the simulator's safety limit and shed {r.shed} "
                "requests (the config cannot keep up; set --max-queue to model shedding)"
            )
    return notes


def format_table(report: SimulationReport) -> str:
    """The side-by-side comparison, one row per policy."""
    header = (
        f"{'policy':<38} {'p50 ms':>8} {'p99 ms':>9} {'p99.9 ms':>9} {'SLO %':>7} "
        f"{'worst10m':>8} {'shed':>8} {'batch':>6} {'fill':>5} {'util':>5} "
        f"{'busy/1k':>8} {'changes':>7} {'fallbk s':>8}"
    )
    if report.scaling:  # what a fleet that scales pays for, and how often it moved
        header += f" {'rep-h':>8} {'max rep':>7} {'scaled':>6}"
    clients = any(r.client_latency is not None for r in report.results)
    if clients:  # what clients see: the worker's latency plus the overhead outside it
        header += f" {'client p50':>10} {'client p99':>10} {'client SLO %':>12}"
    lines = [
        f"trace {report.trace}: {report.requests:,} requests, {report.workers} workers, "
        f"SLO p99 {report.slo_s * 1e3:g} ms, latency {report.latency_model}",
        header,
        "-" * len(header),
    ]
    for r in report.results:
        lat = r.latency
        lines.append(
            f"{r.policy:<38} {_fmt(lat.p50_s, 1e3, 8)} {_fmt(lat.p99_s, 1e3, 9)} "
            f"{_fmt(lat.p999_s, 1e3, 9)} {r.slo_attainment * 100:>7.2f} "
            f"{r.worst_window_attainment(600.0) * 100:>8.2f} {r.shed:>8} "
            f"{r.mean_batch_size:>6.1f} {r.batch_fill_ratio:>5.2f} {r.utilization:>5.2f} "
            f"{r.busy_seconds_per_1k:>8.3f} {r.config_changes:>7} {r.fallback_s:>8.0f}"
            + (
                f" {r.replica_seconds / 3600:>8.2f} {r.max_replicas:>7} {r.replica_changes:>6}"
                if report.scaling
                else ""
            )
            + (_client_columns(r) if clients else "")
        )
    if clients:
        lines.append(
            "client columns: the worker's latency plus the time outside the batcher that the "
            "profile measured under load, at each tick's rate (the latency the SLO is judged "
            f"on); {report.client_overhead}"
        )
    lines.extend(f"note: {n}" for n in report_notes(report))
    return "\n".join(lines)


def _client_columns(result: PolicyResult) -> str:
    client, attainment = result.client_latency, result.client_slo_attainment
    if client is None or attainment is None:
        return f" {'-':>10} {'-':>10} {'-':>12}"
    return f" {_fmt(client.p50_s, 1e3, 10)} {_fmt(client.p99_s, 1e3, 10)} {attainment * 100:>12.2f}"


def _fmt(value: float | None, scale: float, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value * scale:>{width}.2f}"


def policy_file_stem(policy: str) -> str:
    """A file-name-safe form of a policy spec: "static:max_batch=32" -> "static-max_batch-32"."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", policy).strip("-")


def write_outputs(report: SimulationReport, out_dir: Path) -> list[Path]:
    """summary.json and one timeline CSV per policy; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "summary.json"
    summary.write_text(json.dumps(summary_dict(report), indent=2) + "\n")
    written = [summary]
    for result in report.results:
        stem = policy_file_stem(result.policy)
        path = out_dir / f"timeline-{stem}.csv"
        _write_timeline(result, path)
        decisions = out_dir / f"decisions-{stem}.jsonl"
        _write_decisions(result, decisions)
        written.extend((path, decisions))
    return written


def _write_decisions(result: PolicyResult, path: Path) -> None:
    """The controller's kept decision records, one JSON object per line."""
    with path.open("w") as handle:
        for record in result.decisions:
            handle.write(json.dumps(record.to_dict()) + "\n")


def _write_timeline(result: PolicyResult, path: Path) -> None:
    names = [f.name for f in dataclasses.fields(result.timeline[0])] if result.timeline else []
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(names)
        # getattr, not dataclasses.astuple: the rows are flat, and astuple deep-copies
        # every value (a day's five timelines took 5 s).
        for row in result.timeline:
            writer.writerow("" if v is None else v for v in (getattr(row, n) for n in names))
