"""`tidal demo`: a newcomer's first live run, on one machine, no Redis.

It checks every flag first, then sizes itself to the machine: each worker gets an equal
share of the cores as torch threads (two workers at torch's default of every core, beside
the controller and the load generator, oversubscribe a 2-core machine, and a profile
taken that way is noise), the demo model is profiled as both workers will run it, side by
side, and the replay's peak is set to a share of what that profile serves within the SLO.
So the run holds its SLO on a busy machine too: it measured the machine it got.

Then it starts `tidal controller --redis none` hosting two workers, declares the flash
sales through the operator API once the pool is ready (shifted onto the replay's clock),
replays the promotion day time-compressed against them with `tidal loadgen`, and ends
with what clients saw against the SLO and what the controller did before each sale.
`--json` prints the same as one JSON object, the last line. Its working folder (token,
logs, profile, every request) is its owner's alone and removed at exit unless
`--keep-files`.

This module is the command's flags; the run is `server.tools.demo_run`, imported when
the demo runs, so `--help` answers at once.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simulations.cli import duration_arg, positive_float_arg

POOL = "demo"
WORKERS = 2
DEMO_MODELS = ("demo-cnn", "demo-ranker", "demo-text")
"""The built-in models (server.worker.models, which loads torch, says the same)."""
PEAK_SHARE = 0.5
"""The replay's peak as a share of what the profile serves within the SLO: the rest is
for what the profile does not see (HTTP, the controller, the load generator)."""
REQUESTS_PER_FREE_CORE = 100.0
"""The replay's peak per core left idle by other work. Set when a request cost about 5 ms
of CPU outside the model here (the load generator's httpx client 3 ms, measured at 300
req/s on 94% of a core; the controller process's HTTP, which hosts both workers on one
event loop, 1.7 ms): a free core carried about 200 req/s of it; half of that, for
headroom. The load generator now costs about 0.2 ms a request (server.tools.lean_http),
so this is conservative; a higher value is not yet measured with the demo."""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    demo = subparsers.add_parser(
        "demo",
        help="controller + 2 workers + load generator on a compressed promo day",
        description="A first live run on this machine: profile the model, size the replay "
        "to what it serves, run a controller with two workers, replay a promotion day "
        "with its flash sales declared, and say what clients saw and what the "
        "controller did.",
    )
    demo.add_argument(
        "--trace",
        type=Path,
        help="trace to replay (default: the promotion day, generated as `tidal trace "
        "promo-day` writes it, with its sales declared)",
    )
    demo.add_argument(
        "--events", type=Path, help="declared events (default: the trace's .events.yaml)"
    )
    demo.add_argument(
        "--time-scale",
        type=positive_float_arg,
        default=360.0,
        help="replay K times faster than recorded (default 360: a day in 4 minutes)",
    )
    demo.add_argument(
        "--peak-rps",
        type=positive_float_arg,
        help=f"the replay's busiest rate in req/s (default: {PEAK_SHARE * 100:.0f}%% of what the "
        f"profile serves within the SLO on 2 workers, at most {REQUESTS_PER_FREE_CORE:.0f} "
        "per idle core)",
    )
    demo.add_argument(
        "--duration",
        type=duration_arg,
        help="stop the replay after this long, e.g. 30s (default: the whole trace)",
    )
    demo.add_argument(
        "--policy", default="predictive", help="the controller's policy (default predictive)"
    )
    demo.add_argument(
        "--model",
        default="demo-ranker",
        help="the workers' model: demo-ranker (a ranking MLP, whose batches pay), demo-cnn, "
        "demo-text, a TorchScript path or module:factory (default demo-ranker)",
    )
    demo.add_argument(
        "--latency-model",
        help="the planner's latency model (a profile JSON or linear:BASE_MS,PER_ITEM_MS); "
        "default: profile --model first (about 15 s)",
    )
    demo.add_argument(
        "--port",
        type=int,
        default=8000,
        help="the API's port; the two workers take the next two (default 8000)",
    )
    demo.add_argument(
        "--keep-running", action="store_true", help="keep serving after the replay (Ctrl-C ends)"
    )
    demo.add_argument(
        "--keep-files",
        action="store_true",
        help="keep the working folder (token, logs, profile, every request) after exit",
    )
    demo.add_argument("--json", action="store_true", help="end with the outcome as one JSON object")
    demo.set_defaults(handler=run_demo)


def run_demo(args: argparse.Namespace) -> int:
    from server.tools.demo_run import run_demo as run

    return run(args)
