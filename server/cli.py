"""`tidal`: the operator's command, one subcommand per job.

Subcommands live beside the code they drive. This module knows only their names, the
module whose `add_parser` registers each one, the line `tidal --help` shows for it and
the install extra its imports come from; it imports the module of the subcommand asked
for and no other. So `tidal --help` loads none of numba, pandas, statsmodels, torch or
the web stack (well under a second instead of seven), and `tidal worker` loads no
statsmodels. Each handler returns the exit status. User errors print one line and exit 2;
so does a subcommand whose extra is not installed, naming the extra.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from simulations.cli import mark_durations, run_reporting_errors
from simulations.command_parser import CommandParser


@dataclass(frozen=True, slots=True)
class Command:
    """A subcommand: `module.add_parser(subparsers)` registers `name` with its options.

    `help` is the line `tidal --help` lists without importing the module (a test checks
    it is the one the module registers); `extra` is the install extra that provides the
    module's third-party imports (None: the base install).
    """

    name: str
    module: str
    help: str
    extra: str | None = None


COMMANDS = (
    Command("trace", "simulations.trace_cli", "generate synthetic traces"),
    Command("forecast", "simulations.forecast_cli", "forecast request rate"),
    Command("worker", "server.worker.cli", "serve a model through the dynamic batcher", "worker"),
    Command("profile", "server.tools.profile", "measure latency per batch size", "worker"),
    Command(
        "loadgen", "server.tools.loadgen", "replay a trace against a worker (open loop)", "worker"
    ),
    Command(
        "controller",
        "server.control.cli",
        "run the control plane: forecast, decide, push configs, serve the API",
        "control",
    ),
    Command(
        "demo",
        "server.tools.demo",
        "controller + 2 workers + load generator on a compressed promo day",
        "all",
    ),
    Command(
        "engine",
        "server.engines.triton_cli",
        "join an engine you run (Triton) to a pool, steered by the controller",
        "triton",
    ),
)

_CONTROL = ("fastapi", "uvicorn", "httpx", "prometheus_client", "redis")
EXTRAS = {
    "control": _CONTROL,
    "worker": ("torch", *_CONTROL),
    "all": ("torch", *_CONTROL),
    "triton": ("tritonclient", "httpx", "redis"),
}
"""What each install extra of pyproject.toml provides, as top-level import names."""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The `tidal` parser; only `command`'s module is imported to register its options,
    the others are listed by name and help line."""
    parser = CommandParser(
        prog="tidal", description="Tidal: forecast-driven batching for inference fleets."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for entry in COMMANDS:
        if entry.name == command:
            importlib.import_module(entry.module).add_parser(subparsers)
        else:
            subparsers.add_parser(entry.name, help=entry.help)
    return mark_durations(parser)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    entry = _command_in(argv)
    missing = _first_missing(EXTRAS[entry.extra]) if entry and entry.extra else None
    if missing is not None:
        return _needs_extra(entry.name, entry.extra, missing)
    command = entry.name if entry else None
    try:
        args = build_parser(command).parse_args(argv)
        return run_reporting_errors("tidal", lambda: args.handler(args))
    except ModuleNotFoundError as error:
        package = (error.name or "").partition(".")[0]
        if entry is None or package not in EXTRAS["worker"]:
            raise  # not an extra's package: a bug, keep the traceback
        # Only `controller --local-workers` gets here: the workers need torch.
        return _needs_extra(entry.name, "worker" if package == "torch" else "control", package)


def _command_in(argv: Sequence[str]) -> Command | None:
    """The subcommand argv names: its first word, when that is one (`tidal` itself takes
    no options but --help)."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return next((entry for entry in COMMANDS if entry.name == first), None)


def _first_missing(packages: Sequence[str]) -> str | None:
    """The first package that cannot be imported, found without importing any."""
    for package in packages:
        try:
            if importlib.util.find_spec(package) is None:
                return package
        except (ImportError, ValueError):  # a finder refused it, or a None in sys.modules
            return package
    return None


def _needs_extra(command: str, extra: str, package: str) -> int:
    print(
        f"tidal {command}: error: needs the {extra!r} extra ({package} is not installed): "
        f"pip install -e '.[{extra}]'",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
