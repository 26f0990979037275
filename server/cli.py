"""`tidal`: the operator's command, one subcommand per job.

Subcommands live beside the code they drive and register themselves here; each runs a
handler that returns the exit status. User errors print one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from server.control import cli as controller_cli
from server.tools import demo, loadgen
from server.tools import profile as profile_cli
from server.worker import cli as worker_cli
from simulations import forecast_cli, trace_cli
from simulations.cli import run_reporting_errors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tidal", description="Tidal: forecast-driven batching for inference fleets."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    trace_cli.add_parser(subparsers)
    forecast_cli.add_parser(subparsers)
    worker_cli.add_parser(subparsers)
    profile_cli.add_parser(subparsers)
    loadgen.add_parser(subparsers)
    controller_cli.add_parser(subparsers)
    demo.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_reporting_errors("tidal", lambda: args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
