"""`simulate`'s wall time, this checkout against an earlier commit, side by side.

Two workloads, each a `simulate` child process as a user runs it, alternated between the
two checkouts (so drift in the machine's load hits both), each output compared with the
other checkout's (the JSON summary, its timing fields left out):

- `default`: `simulate --trace examples/promo_day.csv` (its default policies: three
  statics; 172.7 million requests each). Target (issue 4/5): under 20 s on 2 cores.
- `four-day`: a 4-day count trace at 5-minute steps scaled to a 500 req/s mean (the NYC
  taxi trace's first 4 days when `--taxi` is given, each 30-minute count spread evenly
  over its six 5-minute steps; else the promotion day's hourly shape repeated), with
  six policies: two statics, aimd, reactive, predictive and the oracle. Target: under
  3 minutes.

The earlier commit (`--base`, default 6522455, the last commit before issue 4/5) is
checked out into a temporary git worktree.

    PYTHONPATH=. python benchmarks/simulate_speed.py --base 6522455 \\
        --taxi ../shared/traces/nyc_taxi.csv

Prints a table; the last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIX = [
    "--policy", "static:max_batch=32,timeout=10ms", "--policy", "static:max_batch=64,timeout=35ms",
    "--policy", "aimd", "--policy", "reactive", "--policy", "predictive", "--policy", "oracle",
]  # fmt: skip
TARGETS_S = {"default": 20.0, "four-day": 180.0}


def four_day_trace(folder: Path, taxi: Path | None) -> Path:
    """The 4-day, 5-minute, 500 req/s mean count trace, written to `folder`."""
    if taxi is not None:
        lines = taxi.read_text().splitlines()[1 : 1 + 4 * 48]
        half_hours = np.array([float(line.split(",")[1]) for line in lines])
        counts = np.repeat(half_hours / 6, 6)
    else:
        hourly = 0.6 + 0.4 * np.sin(np.linspace(0, 2 * np.pi, 24, endpoint=False)) ** 2
        counts = np.tile(np.repeat(hourly, 12), 4)
    counts *= 500.0 * 300 / counts.mean()  # a 500 req/s mean over 5-minute steps
    start = np.datetime64("2026-11-24T00:00")
    stamps = start + np.arange(counts.size) * np.timedelta64(5, "m")
    path = folder / "four_day_5min.csv"
    rows = "".join(f"{s},{c:.0f}\n" for s, c in zip(stamps, counts, strict=True))
    path.write_text("timestamp,count\n" + rows)
    return path


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="tidal-base-"))
    subprocess.run(["git", "worktree", "add", "--detach", str(folder), ref], cwd=ROOT, check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(folder)], cwd=ROOT, check=False)


def simulate(checkout: Path, args: list[str]) -> tuple[float, dict]:
    """(wall seconds, the JSON summary) of `simulate ARGS` run from `checkout`."""
    command = [sys.executable, "-m", "simulations.cli", *args, "--json", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=checkout)
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"simulate from {checkout} failed:\n{done.stderr[-2000:]}")
    return wall_s, json.loads(done.stdout.strip().splitlines()[-1])


TIMING_KEYS = ("wall", "sim_requests_per_s")
"""Summary fields that measure the run's own speed, which differs run to run."""


def without_timing(summary: object) -> object:
    """The summary with every field that times the run left out."""
    if isinstance(summary, dict):
        return {
            k: without_timing(v)
            for k, v in summary.items()
            if not any(key in k for key in TIMING_KEYS)
        }
    if isinstance(summary, list):
        return [without_timing(v) for v in summary]
    return summary


def measure(workloads: dict[str, list[str]], base: Path, repeats: int) -> dict:
    out: dict = {}
    for name, args in workloads.items():
        walls: dict[str, list[float]] = {"base": [], "now": []}
        outputs: dict[str, object] = {}
        for _ in range(repeats):
            for label, checkout in (("base", base), ("now", ROOT)):
                wall_s, summary = simulate(checkout, args)
                walls[label].append(round(wall_s, 1))
                outputs[label] = without_timing(summary)
                print(f"{name:<9} {label:<5} {wall_s:7.1f} s", file=sys.stderr, flush=True)
        median = {k: statistics.median(v) for k, v in walls.items()}
        out[name] = {
            "walls_s": walls,
            "median_s": median,
            "speedup": round(median["base"] / median["now"], 2),
            "identical_output": outputs["base"] == outputs["now"],
            "target_s": TARGETS_S[name],
            "met": median["now"] < TARGETS_S[name],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--base", default="6522455", help="the earlier commit (default: before issue 4/5)"
    )
    parser.add_argument("--taxi", type=Path, help="the NYC taxi trace, for the 4-day shape")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", choices=tuple(TARGETS_S), action="append")
    args = parser.parse_args(argv)
    if args.taxi is not None and not args.taxi.is_file():
        parser.error(f"--taxi {args.taxi}: no such file")
    if not 1 <= args.repeats <= 10:
        parser.error("--repeats must be in [1, 10]")
    with tempfile.TemporaryDirectory() as scratch, worktree(args.base) as base:
        trace = four_day_trace(Path(scratch), args.taxi)
        workloads = {
            "default": ["--trace", "examples/promo_day.csv"],
            "four-day": ["--trace", str(trace), *SIX],
        }
        chosen = {k: v for k, v in workloads.items() if not args.only or k in args.only}
        report = measure(chosen, base, args.repeats)
    print(
        f"\n{'workload':<10} {'base s':>14} {'now s':>14} {'speedup':>8} {'same':>5} {'target':>8}"
    )
    for name, r in report.items():
        verdict = "met" if r["met"] else "MISSED"
        print(
            f"{name:<10} {r['median_s']['base']:>14.1f} {r['median_s']['now']:>14.1f} "
            f"{r['speedup']:>7.2f}x {'yes' if r['identical_output'] else 'NO':>5} "
            f"<{r['target_s']:g} s {verdict}"
        )
    print(json.dumps({"base": args.base, "workloads": report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
