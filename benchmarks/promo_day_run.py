"""Wall time and peak memory of `simulate` with its default policies on the promo day.

Target (issue 2): under 60 s wall and under 1 GB peak RSS on a 2-core machine. Runs the
real command in a child process, so the figures include start-up, trace parsing and
kernel loading, as a user sees them.

    python benchmarks/promo_day_run.py [--trace examples/promo_day.csv]

Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="examples/promo_day.csv")
    args = parser.parse_args()
    command = [
        sys.executable,
        "-m",
        "simulations.cli",
        "--trace",
        args.trace,
        "--json",
        "--no-progress",
    ]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    wall_s = time.perf_counter() - started
    peak_rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    summary = json.loads(result.stdout)
    figures = {
        "trace": args.trace,
        "requests": summary["requests"],
        "policies": len(summary["policies"]),
        "wall_s": round(wall_s, 2),
        "peak_rss_mb": round(peak_rss_mb),
        "simulated_requests_per_s": round(summary["requests"] * len(summary["policies"]) / wall_s),
        "meets_60s": wall_s < 60,
        "meets_1gb": peak_rss_mb < 1024,
    }
    print(f"{'requests':>12} {'policies':>8} {'wall s':>8} {'peak RSS MB':>12} {'req/s':>12}")
    print(
        f"{figures['requests']:>12,} {figures['policies']:>8} {figures['wall_s']:>8.1f} "
        f"{figures['peak_rss_mb']:>12} {figures['simulated_requests_per_s']:>12,}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
