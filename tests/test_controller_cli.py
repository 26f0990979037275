"""`tidal controller` and `tidal demo` from the command line: bad input is one line and
exit 2, and the demo runs end to end."""

from __future__ import annotations

import re
import socket
import subprocess
import sys

import pytest
from redis_server import free_port

from server.cli import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--latency-model", "linear:abc"], "linear"),
        (["--events", "missing.yaml"], "missing.yaml"),
        (["--redis", "http://somewhere:6379"], "--redis"),
        (["--guard", "dwell=forever"], "dwell"),
        (["--token-file", "no-such-token"], "--token-file no-such-token"),
        (["--local-workers", "-1"], "--local-workers"),
        # Defect 2: a bad spec used to serve HTTP with /readyz "starting" forever, silent.
        (["--policy", "statc:max_batch=8"], "unknown policy 'statc'"),
        (["--shadow", "aimd:speed=3"], "unknown option 'speed'"),
        (["--lease", "0"], "--lease"),
        (["--max-replicas", "2", "--workers", "5"], "--workers 5 must be within"),
        (["--replica-startup", "90s"], "need --max-replicas"),
        (["--policy", "predictive:replicas=plan"], "room to scale (--max-replicas)"),
    ],
)
def test_bad_controller_input_is_one_line_and_exit_2(argv, message, capsys):
    assert main(["controller", "--port", str(free_port()), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tidal: error:") and message in err and "\n" not in err


def test_a_busy_port_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "server.cli", "controller", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"tidal: error: --host/--port: cannot listen on 127.0.0.1:{port} (Address already in use)"
    )


def three_free_ports() -> int:
    """A base port with the next two free as well (the demo's API and two workers)."""
    for _ in range(50):
        base = free_port()
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", base + 1))
                b.bind(("127.0.0.1", base + 2))
            return base
        except OSError:
            continue
    raise AssertionError("no three consecutive free ports")


def test_the_demo_runs_end_to_end():
    port = three_free_ports()
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "demo", "--duration", "4s", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"http://127.0.0.1:{port}/v1/pools/demo/decisions" in done.stdout
    assert re.search(r"by status: \{'200': \d+\} ", done.stdout)  # every request answered
    assert "controller:" in done.stdout and "config changes" in done.stdout


def test_the_demo_warns_when_its_latency_model_cannot_meet_the_slo_at_its_peak():
    from adaptive.latency import parse_latency_model
    from server.tools.demo import slo_warning

    assert slo_warning(parse_latency_model("linear:5,0.4"), 2, 0.1, 160.0) is None
    # 50 ms + 10 ms per item: one request alone takes 60 ms of a 100 ms SLO.
    warning = slo_warning(parse_latency_model("linear:50,10"), 2, 0.1, 160.0)
    assert warning is not None
    assert "linear:50,10" in warning and "peaks at 160 req/s" in warning
    assert "no config meets the SLO" in warning
