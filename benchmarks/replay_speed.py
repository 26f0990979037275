"""How fast `simulate` replays a day: policies over processes, and replica decisions.

Two figures, each measured side by side in this run against a baseline (ratios, since
the machine is shared and noisy):

1. The README's adaptive comparison (the promo day with its events, warm-up 20 s, 11
   workers, five policies, `--out`), as a user runs it (a child process: start-up, trace
   parsing, the optimiser's table and the plots included), with the policies spread
   over processes (the default) and kept in one (`--processes 1`). Target: under 60 s.
2. A day of replica decisions: the joint policy (`predictive:replicas=plan`, start-up
   90 s, 4 to 40 replicas) against `predictive` on a fixed fleet of 11, each alone in its
   own run; the figure is the policy's own replay time (`wall_s` in the summary: its
   ticks, not the process's start-up), median of the repeats. Target: within 10%.

    PYTHONPATH=. python benchmarks/replay_speed.py [--repeats 2]

Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time

DAY = ["--trace", "examples/promo_day.csv", "--events", "examples/promo_day.events.yaml"]
README = [
    *DAY,
    "--warmup", "20s", "--workers", "11",
    "--policy", "static:max_batch=64,timeout=35ms", "--policy", "aimd",
    "--policy", "reactive", "--policy", "predictive", "--policy", "oracle",
]  # fmt: skip
FIXED = [*DAY, "--warmup", "20s", "--workers", "11", "--policy", "predictive"]
SCALING = [
    *DAY,
    "--warmup", "20s", "--workers", "4", "--max-replicas", "40", "--replica-startup", "90s",
    "--policy", "predictive:replicas=plan",
]  # fmt: skip


def simulate(args: list[str]) -> tuple[float, dict]:
    """(wall seconds, the JSON summary) of one `simulate` run in a child process."""
    command = [sys.executable, "-m", "simulations.cli", *args, "--json", "--no-progress"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return time.perf_counter() - started, json.loads(done.stdout.strip().splitlines()[-1])


def comparison(repeats: int) -> dict:
    walls: dict[str, list[float]] = {"processes": [], "one_process": []}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(repeats):  # alternate, so drift in the machine's load hits both
            walls["processes"].append(simulate([*README, "--out", out])[0])
            walls["one_process"].append(simulate([*README, "--out", out, "--processes", "1"])[0])
    median = {k: statistics.median(v) for k, v in walls.items()}
    return {
        "wall_s": {k: [round(w, 1) for w in v] for k, v in walls.items()},
        "median_s": {k: round(v, 1) for k, v in median.items()},
        "speedup": round(median["one_process"] / median["processes"], 2),
        "meets_60s": median["processes"] < 60,
    }


def replica_decisions(repeats: int) -> dict:
    ticks: dict[str, list[float]] = {"fixed": [], "scaling": []}
    for _ in range(repeats):
        for name, args in (("fixed", FIXED), ("scaling", SCALING)):
            ticks[name].append(simulate(args)[1]["policies"][0]["wall_s"])
    median = {k: statistics.median(v) for k, v in ticks.items()}
    overhead = median["scaling"] / median["fixed"] - 1
    return {
        "replay_s": {k: [round(t, 1) for t in v] for k, v in ticks.items()},
        "median_s": {k: round(v, 1) for k, v in median.items()},
        "overhead": round(overhead, 3),
        "meets_10pct": overhead <= 0.10,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    readme = comparison(args.repeats)
    replicas = replica_decisions(args.repeats)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"{'run':<54} {'median s':>9}  all")
    rows = [
        ("README comparison, policies over processes", readme, "processes"),
        ("README comparison, one process (--processes 1)", readme, "one_process"),
    ]
    for label, figures, key in rows:
        print(f"{label:<54} {figures['median_s'][key]:>9.1f}  {figures['wall_s'][key]}")
    for label, key in (("predictive, fixed fleet of 11 (its ticks)", "fixed"),
                       ("joint, 4-40 replicas (its ticks)", "scaling")):  # fmt: skip
        print(f"{label:<54} {replicas['median_s'][key]:>9.1f}  {replicas['replay_s'][key]}")
    print(
        f"speed-up from processes {readme['speedup']:.2f}x (under 60 s: {readme['meets_60s']}); "
        f"replica decisions {replicas['overhead']:+.1%} (within 10%: {replicas['meets_10pct']})"
    )
    figures = {"readme": readme, "replica_decisions": replicas, "peak_rss_mb": round(peak_rss_mb)}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
