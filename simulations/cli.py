"""`simulate`: replay a trace under several batching policies and compare them.

    simulate --trace examples/promo_day.csv --policy static:max_batch=32,timeout=10ms \
             --policy static:max_batch=128,timeout=25ms --workers 8 --slo 100ms

With no --trace it replays the built-in promotion day (the generator behind
examples/promo_day.csv, same seed), so it runs anywhere with nothing else.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from adaptive.errors import InvalidInput, TidalError
from adaptive.latency import parse_latency_model
from adaptive.specs import PolicyContext, build_policy
from adaptive.units import parse_duration_s
from simulations.engine import PoolSettings, Routing
from simulations.promo_day import PromoDaySpec, generate_promo_day
from simulations.report import format_table, summary_dict, write_outputs
from simulations.run import SimulationReport, SimulationSettings, simulate
from simulations.traces import CountTrace, Trace, TraceFormat, load_trace

DEFAULT_POLICIES = (
    "static:max_batch=8,timeout=2ms",
    "static:max_batch=32,timeout=10ms",
    "static:max_batch=128,timeout=25ms",
)
DEFAULT_LATENCY_MODEL = "linear:5,0.4"


def _duration(text: str) -> float:
    try:
        return parse_duration_s(text)
    except InvalidInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="simulate",
        description="Replay recorded traffic through Tidal's batching simulator and "
        "compare batching policies side by side.",
    )
    source = parser.add_argument_group("traffic")
    source.add_argument(
        "--trace",
        type=Path,
        help="CSV trace (request- or count-level); default: the built-in promo day",
    )
    source.add_argument(
        "--format",
        choices=[f.value for f in TraceFormat],
        default="auto",
        help="trace format (default: detected from the header)",
    )
    source.add_argument(
        "--time-scale", type=_positive_float, default=1.0, help="replay K times faster (default 1)"
    )
    source.add_argument(
        "--rate-scale",
        type=_positive_float,
        default=1.0,
        help="multiply the request rate by K (default 1)",
    )
    fleet = parser.add_argument_group("fleet")
    fleet.add_argument(
        "--policy",
        action="append",
        metavar="SPEC",
        help="policy spec, repeatable, e.g. static:max_batch=32,timeout=10ms "
        f"(default: {' '.join(DEFAULT_POLICIES)})",
    )
    fleet.add_argument("--workers", type=_positive_int, default=10, help="workers (default 10)")
    fleet.add_argument(
        "--routing",
        choices=[r.value for r in Routing],
        default="shared",
        help="one shared queue, or per-worker queues (default shared)",
    )
    fleet.add_argument(
        "--latency-model",
        default=DEFAULT_LATENCY_MODEL,
        metavar="SPEC|PATH",
        help=f"linear:BASE_MS,PER_ITEM_MS or a profile JSON (default {DEFAULT_LATENCY_MODEL})",
    )
    fleet.add_argument(
        "--max-queue",
        type=_positive_int,
        help="waiting requests per queue past which arrivals are shed",
    )
    fleet.add_argument("--slo", type=_duration, default=0.1, help="p99 latency SLO (default 100ms)")
    run = parser.add_argument_group("run")
    run.add_argument("--tick", type=_duration, default=1.0, help="control tick (default 1s)")
    run.add_argument(
        "--window",
        type=_duration,
        default=10.0,
        help="timeline window, a multiple of the tick (default 10s)",
    )
    run.add_argument("--seed", type=int, default=0, help="seed for arrivals and jitter")
    run.add_argument("--out", type=Path, help="write summary.json, timelines and plots here")
    run.add_argument("--json", action="store_true", help="print only the summary JSON on stdout")
    run.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_reporting_errors("simulate", lambda: _run(args))


def run_reporting_errors(prog: str, command: Callable[[], int]) -> int:
    """Run a command's body; a user's mistake becomes one line on stderr and exit 2."""
    try:
        return command()
    except TidalError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    trace = _load(args)
    for note in trace.notes:
        print(f"simulate: warning: {note}", file=sys.stderr)
    settings = SimulationSettings(
        pool=PoolSettings(args.workers, args.slo, Routing(args.routing), args.max_queue),
        tick_s=args.tick,
        window_s=args.window,
        seed=args.seed,
    )
    context = PolicyContext(slo_s=args.slo, workers=args.workers)
    policies = [build_policy(spec, context) for spec in args.policy or DEFAULT_POLICIES]
    latency = parse_latency_model(args.latency_model)
    report = _simulate_with_progress(trace, policies, settings, latency, args.no_progress)
    _emit(report, args)
    return 0


def _load(args: argparse.Namespace) -> Trace:
    if args.trace is None:
        day = generate_promo_day(PromoDaySpec())
        return CountTrace(
            "promo-day (built-in)",
            1.0 / args.time_scale,
            day.counts.astype(float),
            day.spec.date,
            args.rate_scale,
        )
    return load_trace(
        args.trace, TraceFormat(args.format), time_scale=args.time_scale, rate_scale=args.rate_scale
    )


def _simulate_with_progress(trace, policies, settings, latency, no_progress) -> SimulationReport:
    with tqdm(
        total=round(trace.duration_s),
        unit="sim-s",
        delay=2.0,
        file=sys.stderr,
        disable=True if no_progress else None,
        leave=False,
    ) as bar:

        def advance(t_s: float) -> None:
            bar.update(round(t_s) - bar.n)

        return simulate(trace, policies, settings, latency, on_progress=advance)


def _emit(report: SimulationReport, args: argparse.Namespace) -> None:
    if args.out is not None:
        _write_out(report, args.out)
    if args.json:
        print(json.dumps(summary_dict(report)))
        return
    print(format_table(report))
    if args.out is not None:
        print(f"wrote {args.out}/summary.json, timelines and plots")


def _write_out(report: SimulationReport, out_dir: Path) -> None:
    from simulations.plots import write_plots  # matplotlib loads only when plots are wanted

    try:
        write_outputs(report, out_dir)
        write_plots(report, out_dir)
    except OSError as error:
        raise InvalidInput(f"{out_dir}: cannot write outputs ({error.strerror})") from None


if __name__ == "__main__":
    sys.exit(main())
