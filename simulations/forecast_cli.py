"""`tidal forecast backtest`: rolling-origin evaluation of forecasters on a trace.

    tidal forecast backtest --trace examples/promo_day.csv --step 1m --horizon 10m \
        --events examples/promo_day.events.yaml

Registering the arguments imports nothing heavy; the forecasters and the trace reader
load when the backtest runs.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from simulations.cli import TRACE_FORMATS
from tidal_base.errors import InvalidInput
from tidal_base.units import parse_duration_s

if TYPE_CHECKING:
    from forecaster.backtest import BacktestResult, BacktestSettings
    from forecaster.series import RateSeries

DEFAULT_MODELS = ("seasonal-naive", "holt", "holt-winters", "mstl")
BASELINE = "seasonal-naive"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    forecast = subparsers.add_parser("forecast", help="forecast request rate")
    verbs = forecast.add_subparsers(dest="forecast_verb", required=True, metavar="VERB")
    bt = verbs.add_parser(
        "backtest",
        help="rolling-origin evaluation of forecasters",
        description=__doc__.splitlines()[0],
    )
    bt.add_argument("--trace", type=Path, required=True, help="CSV trace, request- or count-level")
    bt.add_argument(
        "--format",
        choices=TRACE_FORMATS,
        default="auto",
        help="trace format (default: detected from the header)",
    )
    bt.add_argument(
        "--function",
        metavar="HASH",
        help="an Azure Functions trace: replay this function's row (its HashFunction); "
        "default: every function's invocations summed",
    )
    bt.add_argument("--step", default="1m", help="series step (default 1m)")
    bt.add_argument("--horizon", default="10m", help="how far ahead (default 10m)")
    bt.add_argument(
        "--model",
        action="append",
        metavar="SPEC",
        help=f"forecaster spec, repeatable (default: {' '.join(DEFAULT_MODELS)})",
    )
    bt.add_argument("--events", type=Path, help="declared events (YAML or JSON)")
    bt.add_argument("--level", type=float, default=0.9, help="interval level (default 0.9)")
    bt.add_argument(
        "--band",
        choices=("conformal", "analytic"),  # forecaster.conformal.BANDS, without numpy
        default="conformal",
        help="conformal: calibrated on each model's recent residuals per horizon, as the "
        "controller forecasts (default); analytic: the model's own band",
    )
    bt.add_argument(
        "--initial",
        help="history before the first origin (default: a quarter of the trace, at most 21d)",
    )
    bt.add_argument("--refit-every", default="1d", help="full refit interval (default 1d)")
    bt.add_argument("--history", default="28d", help="sliding window each fit sees (default 28d)")
    bt.add_argument("--out", type=Path, help="write backtest.png and backtest.json here")
    bt.add_argument("--json", action="store_true", help="print only the JSON summary")
    bt.set_defaults(handler=run_backtest)


def _steps(text: str, step_s: float, field: str) -> int:
    return max(1, round(parse_duration_s(text, field=field) / step_s))


def run_backtest(args: argparse.Namespace) -> int:
    from forecaster.backtest import backtest
    from forecaster.events import EventAware, load_events
    from forecaster.registry import build_forecaster
    from forecaster.series import series_from_trace
    from simulations.traces import TraceFormat, load_trace

    step_s = parse_duration_s(args.step, field="step")
    if not 0 < args.level < 1:
        raise InvalidInput(f"level must be in (0, 1), got {args.level}")
    trace = load_trace(args.trace, TraceFormat(args.format), function=args.function)
    series = series_from_trace(trace, step_s)
    settings = _settings(args, series)
    events = load_events(args.events) if args.events else ()
    specs = list(dict.fromkeys([BASELINE, *(args.model or DEFAULT_MODELS)]))
    models = [build_forecaster(spec) for spec in specs]
    results = []
    for spec, model in zip(specs, models, strict=True):
        wrapped = EventAware(model, events) if events and spec != BASELINE else model
        results.append(backtest(wrapped, series, settings))
    summary = _summary(trace.name, series, settings, results, specs, args.model)
    if args.out:
        _write_out(args.out, summary, results, series)
    print(json.dumps(summary) if args.json else _table(summary))
    return 0


def _settings(args: argparse.Namespace, series: RateSeries) -> BacktestSettings:
    from forecaster.backtest import BacktestSettings

    step_s = series.step_s
    initial = (
        _steps(args.initial, step_s, "initial")
        if args.initial
        else min(len(series) // 4, _steps("21d", step_s, "initial"))
    )
    return BacktestSettings(
        horizon_steps=_steps(args.horizon, step_s, "horizon"),
        initial_steps=initial,
        refit_every_steps=_steps(args.refit_every, step_s, "refit-every"),
        history_steps=_steps(args.history, step_s, "history"),
        level=args.level,
        band=args.band,
    )


def _summary(trace, series, settings, results, specs, requested) -> dict:
    baseline_mae = results[0].mae
    shown = [
        (s, r)
        for s, r in zip(specs, results, strict=True)
        if requested is None or s in requested or s == BASELINE
    ]
    return {
        "trace": trace,
        "step_s": series.step_s,
        "horizon_s": settings.horizon_steps * series.step_s,
        "level": settings.level,
        "band": settings.band,
        "models": [
            {
                "model": spec,
                "mae": round(r.mae, 4),
                "smape": round(r.smape, 5),
                "mase": round(r.mae / baseline_mae, 4) if baseline_mae else math.nan,
                "coverage": round(r.coverage, 4),
                "conformal_share": round(r.conformal_share, 4),
                "update_predict_ms_p99": round(r.update_predict_ms_p99, 4),
                "update_predict_ms_mean": round(r.update_predict_ms_mean, 4),
                "fit_s": round(r.fit_s, 4),
                "fallback": r.fallback,
            }
            for spec, r in shown
        ],
    }


def _table(summary: dict) -> str:
    lines = [
        f"{summary['trace']}: step {summary['step_s']:g}s, horizon {summary['horizon_s']:g}s, "
        f"{summary['level']:.0%} {summary['band']} intervals; MAE in requests per step; MASE "
        "is MAE over seasonal-naive's"
        + (
            "; calib: origins with the whole horizon calibrated"
            if summary["band"] == "conformal"
            else ""
        ),
        f"{'model':<22} {'MAE/step':>10} {'sMAPE':>7} {'MASE':>6} {'cover':>6} {'calib':>6} "
        f"{'upd+pred p99 ms':>15} {'fit s':>7}",
    ]
    for m in summary["models"]:
        lines.append(
            f"{m['model']:<22} {m['mae']:>10.1f} {m['smape']:>7.3f} {m['mase']:>6.3f} "
            f"{m['coverage']:>6.1%} {m['conformal_share']:>6.1%} "
            f"{m['update_predict_ms_p99']:>15.3f} {m['fit_s']:>7.3f}"
        )
        if m["fallback"]:
            lines.append(f"  note: {m['model']} fell back to {m['fallback']}")
    return "\n".join(lines)


def _write_out(out: Path, summary: dict, results: list[BacktestResult], series) -> None:
    from forecaster.plots import plot_backtest  # matplotlib only when asked

    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "backtest.json").write_text(json.dumps(summary, indent=2) + "\n")
        plot_backtest(results, series, out / "backtest.png")
    except OSError as error:
        raise InvalidInput(f"{out}: cannot write outputs ({error.strerror})") from None
