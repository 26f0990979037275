"""`simulate`: replay a trace under several batching policies and compare them.

    simulate --trace examples/promo_day.csv --policy static:max_batch=32,timeout=10ms \
             --policy static:max_batch=128,timeout=25ms --workers 8 --slo 100ms

With no --trace it replays the built-in promotion day (the generator behind
examples/promo_day.csv, same seed), so it runs anywhere with nothing else.

This module builds the parser from light imports only; the simulator (numba, pandas)
loads inside the functions that run it, so `simulate --help`, and the `tidal`
subcommands that borrow the argument helpers here, start fast.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from adaptive.config import MAX_BATCH_SIZE, MAX_TIMEOUT_S
from adaptive.policy_kinds import POLICY_KINDS, policy_kinds_help
from simulations.command_parser import CommandParser
from tidal_base.errors import InvalidInput, TidalError
from tidal_base.specs import Spec, bare_durations, parse_spec
from tidal_base.units import parse_duration_s

if TYPE_CHECKING:
    import numpy as np

    from adaptive.fleet import FleetLimits
    from adaptive.guards import Guardrails
    from adaptive.latency import LatencyModel
    from adaptive.optimizer import PerformanceTable
    from adaptive.specs import PolicyContext
    from forecaster.events import Event
    from simulations.engine import PoolSettings
    from simulations.run import SimulationReport
    from simulations.traces import Trace

DEFAULT_POLICIES = (
    "static:max_batch=8,timeout=2ms",
    "static:max_batch=32,timeout=10ms",
    "static:max_batch=128,timeout=25ms",
)
DEFAULT_LATENCY_MODEL = "linear:5,0.4"
TRACE_FORMATS = ("auto", "requests", "counts")
"""`simulations.traces.TraceFormat`'s values, here so that --help needs no pandas (a test
checks that they agree)."""
ROUTINGS = ("shared", "round-robin", "shortest-queue")
"""`simulations.engine.Routing`'s values, here so that --help needs no numba (checked too)."""


def duration_arg(text: str) -> float:
    try:
        return parse_duration_s(text)
    except InvalidInput as error:
        raise argparse.ArgumentTypeError(str(error)) from None


BARE_SECONDS = "a bare number is seconds"


def mark_durations(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Say in the help of every duration flag, subcommands' too, that a bare number is
    seconds (`--slo 100` is 100 s, not 100 ms)."""
    for action in parser._actions:
        if action.type is duration_arg and action.help and BARE_SECONDS not in action.help:
            action.help = f"{action.help.rstrip()} ({BARE_SECONDS})"
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                mark_durations(sub)
    return parser


def warn_implausible_durations(prog: str, slo_s: float | None, timeouts_s=()) -> None:
    """A bare number is seconds: an SLO over a minute or a batch timeout over 10 s is
    accepted, and said, since it is most likely milliseconds written without a unit."""
    if slo_s is not None and slo_s > 60:
        print(
            f"{prog}: warning: --slo {slo_s:g} is {slo_s:g} seconds ({BARE_SECONDS}); "
            f"for milliseconds write {slo_s:g}ms",
            file=sys.stderr,
        )
    for where, timeout_s in timeouts_s:
        if timeout_s > 10:
            print(
                f"{prog}: warning: {where}: a batch timeout of {timeout_s:g} s "
                f"({BARE_SECONDS}); for milliseconds write {timeout_s:g}ms",
                file=sys.stderr,
            )


def warn_bare_durations(prog: str, spec: Spec, keys: set[str], where: str) -> set[str]:
    """Say, one line each, which duration options of `spec` are bare numbers (read as
    seconds, as the duration flags are); `where` is how the user wrote it. Returns their
    keys."""
    found = bare_durations(spec, keys)
    for key, value in found:
        print(
            f"{prog}: warning: {key}={value} in {where} has no unit, read as {value} s; "
            f"write {value}ms or {value}s",
            file=sys.stderr,
        )
    return {key for key, _ in found}


def warn_bare_policy_durations(prog: str, text: str, where: str | None = None) -> set[str]:
    """`warn_bare_durations` for a policy spec (`where` defaults to the spec itself)."""
    spec = parse_spec(text)
    kind = POLICY_KINDS.get(spec.name)
    keys = kind.duration_keys() if kind is not None else set()
    return warn_bare_durations(prog, spec, keys, where or spec.text)


def positive_int_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="simulate",
        description="Replay recorded traffic through Tidal's batching simulator and\n"
        "compare batching policies side by side.",
        epilog=policy_kinds_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_argument_group("traffic")
    source.add_argument(
        "--trace",
        type=Path,
        help="CSV trace (request- or count-level); default: the built-in promo day",
    )
    source.add_argument(
        "--format",
        choices=TRACE_FORMATS,
        default="auto",
        help="trace format (default: detected from the header)",
    )
    source.add_argument(
        "--function",
        metavar="HASH",
        help="an Azure Functions trace: replay this function's row (its HashFunction); "
        "default: every function's invocations summed",
    )
    source.add_argument(
        "--time-scale",
        type=positive_float_arg,
        default=1.0,
        help="replay K times faster (default 1)",
    )
    source.add_argument(
        "--rate-scale",
        type=positive_float_arg,
        default=1.0,
        help="multiply the request rate by K (default 1)",
    )
    fleet = parser.add_argument_group("fleet")
    fleet.add_argument(
        "--policy",
        action="append",
        metavar="SPEC",
        help="policy spec, repeatable, e.g. static:max_batch=32,timeout=10ms; the kinds "
        f"and their options are listed below (default: {' '.join(DEFAULT_POLICIES)})",
    )
    fleet.add_argument("--workers", type=positive_int_arg, default=10, help="workers (default 10)")
    fleet.add_argument(
        "--routing",
        choices=ROUTINGS,
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
        type=positive_int_arg,
        help="waiting requests per queue past which arrivals are shed",
    )
    fleet.add_argument(
        "--slo", type=duration_arg, default=0.1, help="p99 latency SLO (default 100ms)"
    )
    fleet.add_argument(
        "--warmup",
        type=duration_arg,
        default=0.0,
        help="warm-up time per batch-size bucket; batches run padded to power-of-two "
        "buckets and raising the cap waits for warm-up (default 0: no warm-up modelled)",
    )
    fleet.add_argument(
        "--reload",
        type=duration_arg,
        default=0.0,
        help="model reload per config change, as Triton does: a change serves only after "
        "it, the old config serving meanwhile (default 0: changes are free)",
    )
    fleet.add_argument(
        "--min-replicas",
        type=positive_int_arg,
        help="with --max-replicas: the fewest replicas a policy may scale in to (default 1)",
    )
    fleet.add_argument(
        "--max-replicas",
        type=positive_int_arg,
        help="let policies that plan capacity change the replica count, up to N (starting "
        "from --workers); without it the fleet is fixed",
    )
    fleet.add_argument(
        "--replica-startup",
        type=duration_arg,
        default=0.0,
        help="time from asking for a replica to its model loaded; its buckets then warm "
        "(--warmup) before it takes traffic (default 0)",
    )
    control = parser.add_argument_group("control")
    control.add_argument(
        "--events",
        type=Path,
        help="declared traffic events (YAML/JSON) for the forecasting policies",
    )
    control.add_argument(
        "--shadow",
        metavar="SPEC",
        help="a policy that decides beside each --policy; recorded in the decisions, never applied",
    )
    control.add_argument(
        "--guard",
        metavar="KEY=VALUE,...",
        default="",
        help="guardrails: min_batch, max_batch, min_timeout, max_timeout, dwell, max_step, "
        "hysteresis (default dwell=60s,max_step=4,hysteresis=0.25)",
    )
    run = parser.add_argument_group("run")
    run.add_argument("--tick", type=duration_arg, default=1.0, help="control tick (default 1s)")
    run.add_argument(
        "--window",
        type=duration_arg,
        default=10.0,
        help="timeline window, a multiple of the tick (default 10s)",
    )
    run.add_argument("--seed", type=int, default=0, help="seed for arrivals and jitter")
    run.add_argument(
        "--prime",
        type=duration_arg,
        metavar="DURATION",
        help="the trace's first DURATION primes every policy's forecast, as the live "
        "control plane primes from the traffic its bus recorded, and is not replayed or "
        "scored (a forecaster meets day 2 having seen day 1)",
    )
    run.add_argument("--out", type=Path, help="write summary.json, timelines and plots here")
    run.add_argument("--json", action="store_true", help="print only the summary JSON on stdout")
    run.add_argument(
        "--processes",
        type=positive_int_arg,
        help="replay on N cores (default: every core): the policies are split into as "
        "many processes as makes the replay shortest; 1 keeps the replay in this process",
    )
    run.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    return mark_durations(parser)


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
    from adaptive.latency import parse_latency_model
    from adaptive.specs import build_policy
    from forecaster.series import epoch_seconds
    from simulations.engine import PoolSettings, Routing
    from simulations.run import SimulationSettings

    pool = PoolSettings(  # validated before the trace loads: a bad flag fails at once
        args.workers,
        args.slo,
        Routing(args.routing),
        args.max_queue,
        warmup_s=args.warmup,
        reload_s=args.reload,
        fleet=_fleet_limits(args),
    )
    _check_plausible_flags(args)
    if args.out is not None:
        check_writable_folder(args.out, "--out")  # before the run, not after it
    trace, history = _primed(_load(args), args.prime)
    _check_plausible_replay(trace, args)
    for note in trace.notes:
        print(f"simulate: warning: {note}", file=sys.stderr)
    origin_s = epoch_seconds(trace.origin)
    settings = SimulationSettings(
        pool=pool,
        tick_s=args.tick,
        window_s=args.window,
        seed=args.seed,
        events=_events(args, origin_s),
        origin_s=origin_s,
        guardrails=parse_guardrails(args.guard),
        on_trace_clock=trace.origin is not None and args.time_scale == 1,
        history=history,
    )
    latency = parse_latency_model(args.latency_model)
    context = policy_context(trace, latency, pool)
    specs = args.policy or DEFAULT_POLICIES
    policies = [build_policy(spec, context) for spec in specs]
    shadows = [build_policy(args.shadow, context) if args.shadow else None for _ in specs]
    bare = [warn_bare_policy_durations("simulate", spec) for spec in specs]
    if args.shadow:
        warn_bare_policy_durations("simulate", args.shadow)
    warn_bare_guard_durations("simulate", args.guard)
    timeouts = [  # a bare timeout has been warned about above
        (p.spec, p.initial_config().timeout_s)
        for p, keys in zip(policies, bare, strict=True)
        if "timeout" not in keys
    ]
    warn_implausible_durations("simulate", args.slo, timeouts)
    report = _simulate_with_progress(
        trace, policies, settings, latency, args.no_progress, shadows, args.processes
    )
    for result in report.results:  # a model that would not fit: kept going, said here
        if result.fit_failures:
            print(
                f"simulate: {result.policy}: {result.fit_failures} forecast fits failed "
                f"(last: {result.last_fit_error}); it forecast with its last good fit and "
                "retried after a backoff",
                file=sys.stderr,
            )
    _emit(report, args)
    return 0


MAX_WORKERS = 10_000
"""The most simulated workers (the engine keeps per-worker state and scans it each tick)."""
MAX_REQUESTS = 1e10
"""The most requests one run replays (the promotion day's 173 million take about 35 s)."""
MAX_CHUNK_REQUESTS = 2e8
"""The most arrivals in one 60 s chunk of the replay (1.6 GB of arrival times)."""


def _check_plausible_flags(args: argparse.Namespace) -> None:
    for flag, value in (("--workers", args.workers), ("--max-replicas", args.max_replicas)):
        if value is not None and value > MAX_WORKERS:
            raise InvalidInput(f"{flag} {value}: at most {MAX_WORKERS:,} simulated workers")
    if args.prime is not None and (args.prime <= 0 or args.prime != math.floor(args.prime)):
        raise InvalidInput(
            f"--prime must be a positive whole number of seconds, got {args.prime:g}"
        )


def _check_plausible_replay(trace: Trace, args: argparse.Namespace) -> None:
    """Refuse, before any work, a replay that would not fit or not mean anything."""
    scaled = f"--time-scale {args.time_scale:g}, --rate-scale {args.rate_scale:g}"
    if trace.duration_s < 2 * args.tick:
        raise InvalidInput(
            f"{trace.name}: the replay lasts {trace.duration_s:.3g} s ({scaled}), less than "
            f"two control ticks (--tick {args.tick:g}s): lower --time-scale"
        )
    requests = trace.expected_requests
    if requests > MAX_REQUESTS:
        raise InvalidInput(
            f"{trace.name}: the replay would hold {requests:.3g} requests ({scaled}); "
            f"at most {MAX_REQUESTS:.0e}: lower --rate-scale"
        )
    per_chunk = requests / trace.duration_s * 60.0
    if per_chunk > MAX_CHUNK_REQUESTS:
        raise InvalidInput(
            f"{trace.name}: {requests / trace.duration_s:.3g} req/s on average ({scaled}) "
            f"puts {per_chunk:.3g} arrivals in a minute of replay, at most "
            f"{MAX_CHUNK_REQUESTS:.0e}: lower --time-scale or --rate-scale"
        )


def check_writable_folder(folder: Path, flag: str) -> None:
    """Create `folder` if needed and prove a file can be written there, or say why."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".tidal-write-check"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise InvalidInput(f"{flag} {folder}: cannot write there ({error.strerror})") from None


def _fleet_limits(args: argparse.Namespace) -> FleetLimits | None:
    """Replica limits when the fleet may scale; None keeps it at --workers."""
    from adaptive.fleet import FleetLimits

    if args.max_replicas is None:
        if args.min_replicas is not None or args.replica_startup:
            raise InvalidInput("--min-replicas and --replica-startup need --max-replicas")
        return None
    return FleetLimits(args.min_replicas or 1, args.max_replicas, args.replica_startup)


def policy_context(trace: Trace, latency: LatencyModel, pool: PoolSettings) -> PolicyContext:
    """What policies may use in simulation: the optimiser's table and the recorded future."""
    from adaptive.specs import PolicyContext
    from forecaster.series import RateSeries, series_from_trace
    from simulations.calibration import performance_table

    def table(slo_s: float) -> PerformanceTable:
        return performance_table(latency, pool.workers, slo_s, pool.warmup_s > 0, pool.routing)

    def replica_table(slo_s: float) -> PerformanceTable:
        return performance_table(latency, 1, slo_s, pool.warmup_s > 0, pool.routing)

    truth = series_from_trace(trace, trace.duration_s / max(1, round(trace.duration_s)))
    truth = RateSeries(truth.start_s, truth.step_s, truth.counts * trace.rate_scale)
    fleet = pool.fleet
    return PolicyContext(
        slo_s=pool.slo_s,
        workers=pool.workers,
        table=table,
        truth=truth,
        replica_table=replica_table if fleet is not None else None,
        replica_startup_s=fleet.startup_s if fleet is not None else 0.0,
    )


def _primed(trace: Trace, prime_s: float | None) -> tuple[Trace, np.ndarray | None]:
    """The trace to replay and the history that primes the forecasts (`--prime`)."""
    if prime_s is None:
        return trace, None
    from simulations.priming import split_history

    primed = split_history(trace, prime_s)
    return primed.trace, primed.history


def _events(args: argparse.Namespace, origin_s: float) -> tuple[Event, ...]:
    """Declared events, with times compressed like the trace's under --time-scale."""
    if args.events is None:
        return ()
    from forecaster.events import load_events, rescale_events

    return rescale_events(load_events(args.events), origin_s, args.time_scale)


GUARD_KEYS = {
    "min_batch": int,
    "max_batch": int,
    "min_timeout": parse_duration_s,
    "max_timeout": parse_duration_s,
    "dwell": parse_duration_s,
    "max_step": float,
    "hysteresis": float,
}


GUARD_BOUNDS = {
    "min_batch": (MAX_BATCH_SIZE, f"{MAX_BATCH_SIZE:,}"),
    "max_batch": (MAX_BATCH_SIZE, f"{MAX_BATCH_SIZE:,}"),
    "min_timeout": (MAX_TIMEOUT_S, f"{MAX_TIMEOUT_S:g}s"),
    "max_timeout": (MAX_TIMEOUT_S, f"{MAX_TIMEOUT_S:g}s"),
}
"""The largest plausible value of a guard's bounds: what a config may ask for."""


def parse_guardrails(text: str) -> Guardrails:
    """`min_batch=8,max_batch=128,dwell=60s`: errors name the key and the value."""
    from adaptive.guards import Guardrails

    spec = parse_spec("guard:" + text)
    fields = {"min_timeout": "min_timeout_s", "max_timeout": "max_timeout_s", "dwell": "dwell_s"}
    values = {}
    for key, value in spec.options.items():
        convert = GUARD_KEYS.get(key)
        if convert is None:
            raise InvalidInput(f"--guard: unknown key {key!r} (known: {', '.join(GUARD_KEYS)})")
        try:
            values[fields.get(key, key)] = convert(value)
        except ValueError:
            raise InvalidInput(f"--guard: {key} must be a number, got {value!r}") from None
        bound, shown = GUARD_BOUNDS.get(key, (math.inf, ""))
        if values[fields.get(key, key)] > bound:
            raise InvalidInput(f"--guard: {key} must be <= {shown}, got {value}")
    return Guardrails(**values)


def warn_bare_guard_durations(prog: str, text: str) -> None:
    """`warn_bare_durations` for --guard (`dwell=60` is 60 s)."""
    keys = {key for key, convert in GUARD_KEYS.items() if convert is parse_duration_s}
    warn_bare_durations(prog, parse_spec("guard:" + text), keys, f"--guard {text}")


def _load(args: argparse.Namespace) -> Trace:
    from simulations.promo_day import PromoDaySpec, generate_promo_day
    from simulations.traces import CountTrace, TraceFormat, load_trace

    if args.trace is None:
        if args.function is not None:
            raise InvalidInput("--function picks a row of an Azure Functions --trace: give one")
        day = generate_promo_day(PromoDaySpec())
        return CountTrace(
            "promo-day (built-in)",
            1.0 / args.time_scale,
            day.counts.astype(float),
            day.spec.date,
            args.rate_scale,
        )
    return load_trace(
        args.trace,
        TraceFormat(args.format),
        time_scale=args.time_scale,
        rate_scale=args.rate_scale,
        function=args.function,
    )


def _simulate_with_progress(
    trace, policies, settings, latency, no_progress, shadows=None, processes=None
) -> SimulationReport:
    from tqdm import tqdm

    from simulations.run import simulate

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

        return simulate(
            trace,
            policies,
            settings,
            latency,
            on_progress=advance,
            shadows=shadows,
            processes=processes,
        )


def _emit(report: SimulationReport, args: argparse.Namespace) -> None:
    from simulations.report import format_table, summary_dict

    if args.out is not None:
        _write_out(report, args.out)
    if args.json:
        print(json.dumps(summary_dict(report)))
        return
    print(format_table(report))
    if args.out is not None:
        print(f"wrote {args.out}/summary.json, timelines, plots and report.html")


def _write_out(report: SimulationReport, out_dir: Path) -> None:
    from simulations.html_report import write_html_report
    from simulations.plots import write_plots  # matplotlib loads only when plots are wanted
    from simulations.report import write_outputs

    try:
        write_outputs(report, out_dir)
        write_html_report(report, out_dir, write_plots(report, out_dir))
    except OSError as error:
        raise InvalidInput(f"{out_dir}: cannot write outputs ({error.strerror})") from None


if __name__ == "__main__":
    sys.exit(main())
