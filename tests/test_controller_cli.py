"""`tidal controller` and `tidal demo` from the command line: bad input is one line and
exit 2, and the demo runs end to end."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from redis_server import free_port

from server.cli import main

ROOT = Path(__file__).resolve().parents[1]


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


def test_the_demo_runs_end_to_end_from_any_folder_and_leaves_nothing(tmp_path):
    """The README's third command, from a folder that is not the checkout (the default
    trace is generated, not read from examples/), with the profile it takes first."""
    port = three_free_ports()
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "demo", "--duration", "2s", "--port", str(port),
         "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["slo_ms"] == 100
    assert outcome["by_status"] == {"200": outcome["requests"]}  # every request answered
    assert 0 < outcome["p50_ms"] <= outcome["p99_ms"]
    assert 0 <= outcome["slo_attainment"] <= 1
    changes, other = outcome["config_changes"], outcome["other_decisions"]
    assert sum(changes.values()) + sum(other.values()) == outcome["decisions"]
    assert [s["sale"] for s in outcome["before_each_sale"]] == [
        "midnight-sale", "morning-deals", "prime-time-sale",
    ]  # fmt: skip
    sizing = outcome["sizing"]
    assert sizing["threads_per_worker"] >= 1
    assert 0 < sizing["peak_rps"] <= sizing["capacity_rps"]
    # The working folder held the API token: gone at exit.
    assert not list(tmp_path.glob("tidal-demo-*"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--policy", "predictve"], "--policy: unknown policy 'predictve'"),
        (["--policy", "oracle"], "--policy: unknown policy 'oracle'"),
        (["--policy", "static:max_batch=8,timeuot=5ms"], "unknown option 'timeuot'"),
        (["--duration", "0s"], "--duration must be > 0"),
        (["--model", "demo-cnnn"], "--model: unknown model 'demo-cnnn'"),
        (["--trace", "no-such.csv"], "no-such.csv"),
        (["--latency-model", "linear:abc"], "linear"),
    ],
)
def test_bad_demo_input_fails_before_any_profile(argv, message, tmp_path):
    port = three_free_ports()
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "demo", "--port", str(port), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 2
    err = done.stderr.strip()
    assert err.startswith("tidal: error:") and message in err and "\n" not in err, err
    assert "profiling" not in done.stdout
    assert not list(tmp_path.glob("tidal-demo-*"))


def test_the_demo_sizes_its_peak_from_what_the_profile_serves():
    from adaptive.latency import parse_latency_model
    from server.tools.demo_run import capacity_rps, slowest_profile

    fast = capacity_rps(parse_latency_model("linear:5,0.4"), 2, 0.1)
    slow = capacity_rps(parse_latency_model("linear:10,0.8"), 2, 0.1)
    # A machine twice as slow gets a replay at most half as busy (less: within the same
    # SLO it cannot batch as deep).
    assert fast >= 2 * slow > 0
    # 50 ms + 10 ms per item: one request alone takes 60 ms of a 100 ms SLO; two workers
    # serve at most about 2 / 60 ms within it.
    assert capacity_rps(parse_latency_model("linear:50,10"), 2, 0.1) < 40
    side_by_side = [
        {"model": "m", "points": [{"batch_size": 1, "mean_ms": 2.0, "p99_ms": 3.0}]},
        {"model": "m", "points": [{"batch_size": 1, "mean_ms": 2.5, "p99_ms": 2.8}]},
    ]
    merged = slowest_profile(side_by_side)
    assert merged["points"] == [{"batch_size": 1, "mean_ms": 2.5, "p99_ms": 3.0}]
