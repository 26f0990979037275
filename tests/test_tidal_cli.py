"""The `tidal` command's edges: what a mistake on the command line answers."""

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
