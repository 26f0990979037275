"""`tidal trace`: generate synthetic traces, such as the promotion day in examples/."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from tidal_base.errors import InvalidInput
from tidal_base.units import format_duration

if TYPE_CHECKING:
    from simulations.promo_day import PromoDay

PROMO_DAY_DEFAULTS = {
    "seed": 7,
    "mean_rps": 2000.0,
    "peak_rps": 18000.0,
    "date": datetime(2026, 11, 27),
}
"""`simulations.promo_day.PromoDaySpec`'s defaults, here so that --help needs no numpy (a
test checks that they agree)."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    trace = subparsers.add_parser("trace", help="generate synthetic traces")
    kinds = trace.add_subparsers(dest="trace_kind", required=True, metavar="KIND")
    promo = kinds.add_parser(
        "promo-day",
        help="an e-commerce promotion day: diurnal cycle, flash sales, bursty noise",
        description="Write a count-level trace (timestamp,count per second) of a promotion "
        "day, and the schedule of its sales as declared events (YAML).",
    )
    promo.add_argument("--out", type=Path, required=True, help="CSV file to write")
    promo.add_argument(
        "--events", type=Path, help="events YAML to write (default: OUT with .events.yaml)"
    )
    promo.add_argument(
        "--seed",
        type=int,
        default=PROMO_DAY_DEFAULTS["seed"],
        help="seed of the day's randomness (default %(default)s)",
    )
    promo.add_argument(
        "--mean-rps",
        type=float,
        default=PROMO_DAY_DEFAULTS["mean_rps"],
        help="daily mean request rate (default %(default)g)",
    )
    promo.add_argument(
        "--peak-rps",
        type=float,
        default=PROMO_DAY_DEFAULTS["peak_rps"],
        help="expected rate at the biggest sale's peak (default %(default)g)",
    )
    promo.add_argument(
        "--date",
        type=datetime.fromisoformat,
        default=PROMO_DAY_DEFAULTS["date"],
        help="the day, YYYY-MM-DD (default 2026-11-27)",
    )
    promo.set_defaults(handler=run_promo_day)


def run_promo_day(args: argparse.Namespace) -> int:
    from simulations.promo_day import PromoDaySpec, generate_promo_day  # numpy

    spec = PromoDaySpec(
        mean_rps=args.mean_rps, peak_rps=args.peak_rps, seed=args.seed, date=args.date
    )
    day = generate_promo_day(spec)
    events_path = args.events or args.out.with_name(
        args.out.name.removesuffix(".csv") + ".events.yaml"
    )
    try:
        write_counts_csv(day, args.out)
        events_path.write_text(events_yaml(day))
    except OSError as error:
        raise InvalidInput(f"{error.filename}: cannot write ({error.strerror})") from None
    print(
        f"wrote {args.out} ({day.counts.size} s, mean {day.counts.mean():.0f} req/s, "
        f"busiest second {day.counts.max()} req) and {events_path}",
        file=sys.stderr,
    )
    return 0


def write_counts_csv(day: PromoDay, path: Path) -> None:
    rows = (f"{stamp},{count}" for stamp, count in zip(day.timestamps(), day.counts, strict=True))
    path.write_text("timestamp,count\n" + "\n".join(rows) + "\n")


def events_yaml(day: PromoDay) -> str:
    """The sales as operator-declared events, as the forecaster reads them."""
    import yaml

    events = [
        {
            "name": sale.name,
            "start": (day.spec.date + timedelta(seconds=sale.start_s)).isoformat(),
            "end": (day.spec.date + timedelta(seconds=sale.end_s)).isoformat(),
            "multiplier": round(float(sale.multiplier), 2),
            "peak_rps": round(day.sale_peak_rps(sale)),
            "ramp_up": format_duration(sale.ramp_up_s),
            "ramp_down": format_duration(sale.decay_s),
        }
        for sale in day.sales
    ]
    header = (
        f"# Flash sales of a generated promotion day (tidal trace promo-day --seed "
        f"{day.spec.seed} --mean-rps {day.spec.mean_rps:g} --peak-rps {day.spec.peak_rps:g}).\n"
        "# multiplier: peak rate over the day's usual rate at that hour.\n"
    )
    return header + yaml.safe_dump({"events": events}, sort_keys=False)
