"""The `tidal` command's edges: what a mistake on the command line answers."""

import pytest

from server.cli import main


def test_a_bare_timeout_in_the_workers_config_is_warned_about(capsys):
    """--instances 0 is refused after the flags are read and before the model loads."""
    argv = ["worker", "--model", "demo-cnn", "--config", "max_batch=8,timeout=10"]
    assert main([*argv, "--instances", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "tidal worker: warning: timeout=10 in --config max_batch=8,timeout=10 has no unit, "
        "read as 10 s; write 10ms or 10s",
        "tidal: error: --instances must be >= 1, got 0",
    ]


def test_an_implausible_worker_config_is_refused(capsys):
    argv = ["worker", "--model", "demo-cnn", "--config", "max_batch=99999999999,timeout=10ms"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "tidal: error: --config: max_batch must be <= 65,536, got 99999999999\n"
    )


@pytest.mark.parametrize(
    ("argv", "prog", "message"),
    [
        (["bogus"], "tidal", "argument COMMAND: invalid choice: 'bogus' (choose from 'trace', "),
        ([], "tidal", "the following arguments are required: COMMAND"),
        (["worker", "--port", "x", "--model", "m"], "tidal worker", "argument --port: invalid"),
        (
            ["worker", "--model", "m", "--slo", "-5ms"],
            "tidal worker",
            "argument --slo: duration must be a finite value >= 0, got '-5ms'",
        ),
        (["worker", "--slo", "--model", "m"], "tidal worker", "argument --slo: expected one"),
        (["worker", "--model", "m", "--bogus"], "tidal worker", "unrecognized arguments: --bogus"),
        (
            ["trace", "promo-day", "--out", "x.csv", "--seed", "-"],
            "tidal trace promo-day",
            "argument --seed: invalid int value: '-'",
        ),
        (
            ["forecast", "backtest", "--trace", "t.csv", "--level", "-0.5x"],
            "tidal forecast backtest",
            "argument --level: invalid float value: '-0.5x'",
        ),
    ],
)
def test_a_command_line_mistake_is_one_line_and_where_to_look(capsys, argv, prog, message):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    error, hint = capsys.readouterr().err.splitlines()
    assert error.startswith(f"{prog}: error: {message}"), error
    assert hint == f"see '{prog} --help'"


@pytest.mark.parametrize(
    ("argv", "joined"),
    [
        (["worker", "--slo", "-5ms"], ["worker", "--slo=-5ms"]),
        (["worker", "--sl", "-5ms"], ["worker", "--sl=-5ms"]),  # a prefix, as argparse allows
        (["worker", "--slo", "--model", "m"], ["worker", "--slo", "--model", "m"]),
        (["worker", "--slo=-5ms", "--port", "-1"], ["worker", "--slo=-5ms", "--port=-1"]),
        (["worker", "--compile", "-h"], ["worker", "--compile", "-h"]),  # takes no value
        (["worker", "--", "--slo", "-5ms"], ["worker", "--", "--slo", "-5ms"]),
    ],
)
def test_a_value_that_begins_with_a_dash_is_joined_to_its_option(argv, joined):
    from server.cli import build_parser
    from simulations.command_parser import dash_values_joined

    words, innermost = dash_values_joined(build_parser("worker"), argv)
    assert words == joined
    assert innermost.prog == "tidal worker"


def test_a_bare_number_in_the_controllers_specs_is_warned_about(capsys):
    """--local-workers -1 is refused after the warnings and before anything serves."""
    argv = ["controller", "--policy", "static:max_batch=8,timeout=10", "--guard", "dwell=30"]
    assert main([*argv, "--local-workers", "-1"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "tidal controller: warning: timeout=10 in static:max_batch=8,timeout=10 has no unit, "
        "read as 10 s; write 10ms or 10s",
        "tidal controller: warning: dwell=30 in --guard dwell=30 has no unit, read as 30 s; "
        "write 30ms or 30s",
        "tidal: error: --local-workers must be >= 0, got -1",
    ]


def test_every_flag_says_what_it_is_for():
    """Every option of every subcommand has a help line (demo's are its owner's)."""
    import argparse

    from server.cli import COMMANDS, build_parser

    def silent(parser: argparse.ArgumentParser) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                found += [word for sub in action.choices.values() for word in silent(sub)]
            elif action.option_strings and not action.help:
                found.append(f"{parser.prog} {action.option_strings[0]}")
        return found

    commands = [entry.name for entry in COMMANDS if entry.name != "demo"]
    assert [flag for name in commands for flag in silent(build_parser(name))] == []


@pytest.mark.parametrize("target", ["https://127.0.0.1:8001", "127.0.0.1:8001", " , "])
def test_a_load_generator_target_that_is_not_an_http_url_is_refused_first(capsys, tmp_path, target):
    """Before the trace is read or the model loaded: the trace named does not exist."""
    argv = ["loadgen", "--trace", str(tmp_path / "absent.csv"), "--target", target]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("tidal: error: --target: expected ") and error.count("\n") == 1
