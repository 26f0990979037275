"""The arrows point one way, and start-up loads only what a command uses.

The import contracts live in pyproject.toml ([tool.importlinter]) and run through
import-linter; each contract is its own test, so a failure names the contract it broke.
The start-up checks run in fresh interpreters, since this one has imported everything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from server.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
    "contracts"
]


@pytest.fixture(scope="module")
def lint_output() -> str:
    linter = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    linter = linter or shutil.which("lint-imports")
    assert linter, "lint-imports not found: pip install -e '.[test]' installs import-linter"
    result = subprocess.run(
        [linter, "--no-cache", "--no-logo"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.stdout + result.stderr


@pytest.mark.parametrize("contract", CONTRACTS, ids=[c["id"] for c in CONTRACTS])
def test_import_contract_is_kept(contract: dict, lint_output: str) -> None:
    status = re.search(rf"^{re.escape(contract['name'])}\s*(KEPT|BROKEN)", lint_output, re.M)
    assert status, f"import-linter did not report {contract['name']!r}:\n{lint_output}"
    broken = lint_output.partition("Broken contracts")[2]
    assert status.group(1) == "KEPT", f"contract {contract['name']!r} is broken:\n{broken}"


def _loaded_after(code: str) -> set[str]:
    """The top-level modules a fresh interpreter has loaded after running `code`."""
    probe = textwrap.dedent(code) + "\nimport sys\nprint(' '.join(sorted(sys.modules)))\n"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {name.partition(".")[0] for name in result.stdout.splitlines()[-1].split()}


HEAVY = {"torch", "statsmodels", "numba", "pandas", "fastapi", "redis", "uvicorn"}


def test_the_tidal_parser_and_its_help_load_nothing_heavy() -> None:
    loaded = _loaded_after(
        """
        import contextlib, io, server.cli
        server.cli.build_parser()
        with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
            server.cli.main(["--help"])
        """
    )
    assert not loaded & HEAVY


def test_simulate_help_loads_no_simulator() -> None:
    loaded = _loaded_after(
        """
        import contextlib, io, simulations.cli
        with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
            simulations.cli.main(["--help"])
        """
    )
    assert not loaded & HELP_HEAVY


def test_the_worker_loads_no_statsmodels() -> None:
    loaded = _loaded_after(
        """
        import server.cli, server.worker.app, server.worker.cli
        server.cli.build_parser("worker").parse_args(["worker", "--model", "demo-cnn"])
        server.worker.cli.parse_config("max_batch=32,timeout=10ms")
        """
    )
    assert "torch" in loaded  # the probe did load the worker
    assert "statsmodels" not in loaded


def test_the_controller_loads_no_torch() -> None:
    """`tidal controller` runs on the control extra, which has no torch."""
    loaded = _loaded_after("import server.cli, server.control.serve")
    assert "fastapi" in loaded
    assert "torch" not in loaded


HELP_HEAVY = HEAVY | {"httpx", "matplotlib", "scipy", "starlette", "pydantic", "tritonclient"}
HELP_HEAVY |= {"prometheus_client"}
"""What no --help loads: each costs from a tenth of a second (httpx) to seconds (torch)."""

HELPS = [["--help"]] + [[c.name, "--help"] for c in COMMANDS]
HELPS += [["trace", "promo-day", "--help"], ["forecast", "backtest", "--help"]]
HELPS += [["engine", "triton", "--help"]]


@pytest.mark.parametrize("argv", HELPS, ids=" ".join)
def test_every_help_loads_nothing_heavy(argv: list[str]) -> None:
    """Under half a second each, on any machine: building the parser (the subcommand's
    module imported) and writing its help load none of the heavy modules."""
    loaded = _loaded_after(
        f"""
        import contextlib, io, server.cli
        with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):
            server.cli.main({argv!r})
        """
    )
    assert not loaded & HELP_HEAVY, sorted(loaded & HELP_HEAVY)


def test_help_lines_are_the_ones_the_modules_register() -> None:
    from server.cli import COMMANDS, build_parser

    def listed(parser, name: str) -> str:
        subparsers = next(a for a in parser._actions if a.dest == "command")
        return next(a.help for a in subparsers._choices_actions if a.dest == name)

    for entry in COMMANDS:
        assert listed(build_parser(entry.name), entry.name) == entry.help, entry.name


def test_choice_lists_match_the_enums() -> None:
    from simulations.cli import ROUTINGS, TRACE_FORMATS
    from simulations.engine import Routing
    from simulations.traces import TraceFormat

    assert tuple(f.value for f in TraceFormat) == TRACE_FORMATS
    assert tuple(r.value for r in Routing) == ROUTINGS


def test_the_promo_day_defaults_match_the_spec() -> None:
    from simulations.promo_day import PromoDaySpec
    from simulations.trace_cli import PROMO_DAY_DEFAULTS

    spec = PromoDaySpec()
    assert {key: getattr(spec, key) for key in PROMO_DAY_DEFAULTS} == PROMO_DAY_DEFAULTS


BLOCKING_RUN = """
import sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
import server.cli
sys.exit(server.cli.main({argv!r}))
"""


LOCAL_WORKER = ["controller", "--policy", "static", "--local-workers", "1"]


@pytest.mark.parametrize(
    ("blocked", "argv", "extra"),
    [
        ({"torch"}, ["worker", "--model", "demo-cnn"], "worker"),
        ({"fastapi"}, ["worker", "--help"], "worker"),
        ({"redis"}, ["controller"], "control"),
        ({"httpx"}, ["demo"], "all"),
        ({"torch"}, ["profile", "--model", "demo-cnn"], "worker"),
        # The control extra alone runs the controller, but not workers in its process.
        ({"torch"}, [*LOCAL_WORKER, "--port", "0", "--worker-port", "0"], "worker"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(blocked: set, argv: list, extra: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", BLOCKING_RUN.format(blocked=blocked, argv=argv)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"pip install -e '.[{extra}]'" in lines[0]
    assert f"tidal {argv[0]}: error: needs the {extra!r} extra" in lines[0]
