"""A real `tidal worker` process on a free port, driven over HTTP (demo CNN, CPU); the
config endpoint's auth and pool rules on the app in process; the CLI's one-line errors.

The batcher's queue, deadline and drain logic is tested exactly in virtual time
(tests/test_worker_batcher.py); here one real process proves each end to end.
"""

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from test_worker_batcher import cold, virtual

from adaptive.config import BatchConfig
from server.bus.local import LocalPoolBus
from server.worker.app import create_app
from server.worker.link import WorkerLink
from server.worker.models import load_model

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


EXTRA_WORKER_ARGS = os.environ.get("TIDAL_TEST_WORKER_ARGS", "").split()
"""Every real worker these tests start also takes these flags: with `--frontends 2`, the
same tests prove the front-end processes answer exactly as one process does."""


def start_worker(*args: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "TIDAL_API_TOKEN": TOKEN}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server.cli",
            "worker",
            "--model",
            "demo-cnn",
            "--port",
            str(port),
            *args,
            *EXTRA_WORKER_ARGS,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/stats").json()["warming"] is False:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise RuntimeError(process.stdout.read())
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("worker did not start")


@pytest.fixture(scope="module")
def worker():
    process, url = start_worker("--config", "max_batch=8,timeout=20ms", "--max-queue", "500")
    yield url
    process.terminate()
    process.wait(30)


def image(i: int) -> list:
    return torch.rand((3, 32, 32), generator=torch.Generator().manual_seed(i)).tolist()


def test_config_change_mid_load_answers_every_request_correctly(worker):
    model = load_model("demo-cnn")
    with torch.inference_mode():
        expected = model.module(torch.tensor([image(i) for i in range(60)])).tolist()

    async def load():
        async with httpx.AsyncClient(base_url=worker, timeout=30) as client:

            async def one(i):
                await asyncio.sleep(i * 0.003)
                return await client.post("/v1/infer", json={"input": image(i)})

            async def reconfigure():
                for cap, timeout in ((2, 1), (16, 5), (4, 0)):
                    await asyncio.sleep(0.05)
                    r = await client.put(
                        "/v1/config", json={"max_batch": cap, "timeout_ms": timeout}, headers=AUTH
                    )
                    assert r.status_code == 200

            *answers, _ = await asyncio.gather(*(one(i) for i in range(60)), reconfigure())
            return answers

    answers = asyncio.run(load())
    assert [a.status_code for a in answers] == [200] * 60
    for i, answer in enumerate(answers):
        assert answer.json()["output"] == pytest.approx(expected[i], abs=1e-4)
    sizes = {a.json()["timing"]["batch_size"] for a in answers}
    assert len(sizes) > 1


def test_bad_inputs_are_422_naming_the_field(worker):
    r = httpx.post(f"{worker}/v1/infer", json={"input": [[1, 2]]})
    assert r.status_code == 422 and r.json()["field"] == "input" and "3x32x32" in r.json()["error"]
    r = httpx.post(f"{worker}/v1/infer", json={"wrong": 1})
    assert r.status_code == 422 and r.json()["field"] == "input"
    r = httpx.put(f"{worker}/v1/config", json={"max_batch": 0, "timeout_ms": 1}, headers=AUTH)
    assert r.status_code == 422 and r.json()["field"] == "max_batch"
    # The case: 65536 would warm every bucket to 8192 and keep gigabytes resident.
    huge = {"max_batch": 65536, "timeout_ms": 1}
    r = httpx.put(f"{worker}/v1/config", json=huge, headers=AUTH)
    assert r.status_code == 422 and r.json()["field"] == "max_batch"
    assert r.json()["error"].startswith("max_batch must be <= 6239, the largest batch that fits")
    assert httpx.get(f"{worker}/v1/stats").json()["memory_max_batch"] == 6239


def test_nan_inputs_bad_deadline_headers_and_coerced_configs_are_422(worker):
    poisoned = image(0)
    poisoned[1][2][3] = float("nan")
    body = json.dumps({"input": poisoned})  # Python writes NaN, as a careless client would
    r = httpx.post(f"{worker}/v1/infer", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "input", r.text
    raw = bytearray(torch.rand((3, 32, 32)).numpy().tobytes())
    raw[:4] = bytes(torch.tensor([float("inf")]).numpy().tobytes())
    r = httpx.post(
        f"{worker}/v1/infer",
        content=bytes(raw),
        headers={"content-type": "application/octet-stream"},
    )
    assert r.status_code == 422 and "finite" in r.json()["error"]
    for bad in ("nan", "inf", "-5", "0"):
        r = httpx.post(
            f"{worker}/v1/infer", json={"input": image(0)}, headers={"x-deadline-ms": bad}
        )
        assert r.status_code == 422 and r.json()["field"] == "x-deadline-ms", (bad, r.text)
    for config in ({"max_batch": True, "timeout_ms": 1}, {"max_batch": "8", "timeout_ms": 1}):
        r = httpx.put(f"{worker}/v1/config", json=config, headers=AUTH)
        assert r.status_code == 422 and r.json()["field"] == "max_batch", (config, r.text)


def test_a_warm_worker_is_ready(worker):
    ready = httpx.get(f"{worker}/readyz")
    stats = httpx.get(f"{worker}/v1/stats").json()  # earlier tests may have moved its cap
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert ready.json()["warmed_buckets"] == stats["warmed_buckets"] != []


def test_a_standalone_workers_config_needs_the_token(worker):
    good = {"max_batch": 8, "timeout_ms": 20}
    r = httpx.put(f"{worker}/v1/config", json=good)
    assert r.status_code == 401 and r.json()["field"] == "authorization"
    r = httpx.put(f"{worker}/v1/config", json=good, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 403 and r.json()["error"] == "wrong bearer token"
    version = httpx.get(f"{worker}/v1/stats").json()["config"]["version"]
    r = httpx.put(f"{worker}/v1/config", json=good, headers=AUTH)
    assert r.status_code == 200 and r.json()["config"]["version"] == version + 1


def test_config_writes_without_a_token_configured_are_refused():
    app = create_app(load_model("demo-cnn"), virtual(cold(), BatchConfig(4, 0.0)))
    r = TestClient(app).put("/v1/config", json={"max_batch": 2, "timeout_ms": 1}, headers=AUTH)
    assert r.status_code == 403 and "none is configured" in r.json()["error"]


def test_stats_say_what_bounds_the_queue():
    """By default the SLO (before any batch: a full batch per instance); --max-queue N
    a fixed count; --max-queue none nothing."""
    from server.worker.admission import QueueLimit
    from server.worker.cli import parse_queue_limit

    cases = [(None, "slo", 8, 100.0), ("12", "fixed", 12, None), ("none", "none", None, None)]
    for flag, rule, bound, slo_ms in cases:
        limit = parse_queue_limit(flag, 0.1)
        assert isinstance(limit, QueueLimit)
        batcher = virtual(
            cold(), BatchConfig(4, 0.0), instances=2, queue_limit=limit, warm_at_start=False
        )
        stats = TestClient(create_app(load_model("demo-cnn"), batcher)).get("/v1/stats").json()
        assert (stats["queue_bound_rule"], stats["queue_bound"]) == (rule, bound), flag
        assert (stats["slo_ms"], stats["service_rate_rps"]) == (slo_ms, None)


def test_a_pooled_workers_config_belongs_to_its_controller():
    """In a pool, a local config would share its version number with the controller's
    different one; the worker answers 409, whatever the token, and keeps its config."""
    batcher = virtual(cold(), BatchConfig(4, 0.0), warm_at_start=False)
    link = WorkerLink(batcher, LocalPoolBus(), "search", "w0")
    app = create_app(load_model("demo-cnn"), batcher, link, token=TOKEN)
    client = TestClient(app)
    for headers in ({}, AUTH):
        r = client.put("/v1/config", json={"max_batch": 2, "timeout_ms": 1}, headers=headers)
        assert r.status_code == 409, r.text
        assert "PUT /v1/pools/search/override" in r.json()["error"]
        assert r.json()["field"] is None
    assert client.get("/v1/stats").json()["config"]["version"] == 0


def test_metrics_parse_with_the_prometheus_parser(worker):
    httpx.post(f"{worker}/v1/infer", json={"input": image(0)})
    text = httpx.get(f"{worker}/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "tidal_worker_requests",
        "tidal_worker_request_latency_seconds",
        "tidal_worker_queue_wait_seconds",
        "tidal_worker_batch_size",
        "tidal_worker_batch_fill_ratio",
        "tidal_worker_batch_execution_seconds",
        "tidal_worker_queue_depth",
        "tidal_worker_queue_bound",
        "tidal_worker_memory_max_batch_size",
        "tidal_worker_config_max_batch_size",
        "tidal_worker_bucket_warm",
        "tidal_worker_model_instances",
        "tidal_worker_model_info",
        "tidal_build_info",
        "process_cpu_seconds",
        "tidal_worker_padding_waste_ratio",
        "tidal_worker_warmup_ooms",
        "tidal_worker_background_errors",
        "tidal_worker_ready",
    ):
        assert name in families, name
    ok = [s for s in families["tidal_worker_requests"].samples if s.labels.get("outcome") == "ok"]
    assert ok and ok[0].value >= 1
    assert [s.value for s in families["tidal_worker_ready"].samples] == [1.0]
    assert [s.value for s in families["tidal_worker_queue_bound"].samples] == [500.0]
    assert "_created" not in text  # counters carry no creation-time twin
    errors = {s.labels["task"]: s.value for s in families["tidal_worker_background_errors"].samples}
    assert errors.keys() >= {"dispatch", "warm-up", "link-report"} and set(errors.values()) == {0}


def test_full_queue_is_429_an_expired_deadline_504_and_sigterm_drains_and_exits_0():
    """One process (cap 4, so start-up warms four buckets, not seven): a bounded queue
    sheds, a deadline expires while queued, then SIGTERM drains what is queued."""
    process, url = start_worker("--config", "max_batch=4,timeout=800ms", "--max-queue", "2")
    try:

        async def shed_and_expire():
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                started = time.monotonic()

                async def expiring():
                    body = {"input": image(1), "deadline_ms": 300}
                    answer = await client.post("/v1/infer", json=body)
                    return answer, time.monotonic() - started

                first = asyncio.create_task(expiring())
                second = asyncio.create_task(client.post("/v1/infer", json={"input": image(2)}))
                await asyncio.sleep(0.1)
                third = await client.post("/v1/infer", json={"input": image(3)})
                return await first, await second, third

        (first, expired_after_s), second, third = asyncio.run(shed_and_expire())
        assert first.status_code == 504 and first.json()["field"] == "deadline_ms"
        assert 0.3 <= expired_after_s < 0.7  # at its deadline, not at the batch (800 ms)
        assert second.status_code == 200
        assert third.status_code == 429 and third.headers["retry-after"] == "1"

        async def drain():
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                pending = [
                    asyncio.create_task(client.post("/v1/infer", json={"input": image(i)}))
                    for i in range(2)
                ]
                await asyncio.sleep(0.3)  # queued: the batch is due only at 800 ms
                process.send_signal(signal.SIGTERM)
                return await asyncio.gather(*pending)

        answers = asyncio.run(drain())
        assert [a.status_code for a in answers] == [200] * 2
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)


BAD_COMMAND_LINES = {
    # Each names a model that does not exist: an error that names the flag, not the
    # model, proves the flag was checked before any model was loaded (or warmed).
    "--runs": ("profile", "--model", "no-such-model", "--runs", "0"),
    "--device: expected": ("worker", "--model", "no-such-model", "--device", "tpu"),
    "--device cuda": ("worker", "--model", "no-such-model", "--device", "cuda"),
    "--redis": ("worker", "--model", "no-such-model", "--redis", "notaurl"),
    "--slo must be > 0": ("worker", "--model", "no-such-model", "--slo", "0"),
    "--memory-budget must be a size": (
        "worker", "--model", "no-such-model", "--memory-budget", "lots",
    ),
    "--max-queue must be an integer >= 1 or none, got '0'": (
        "worker", "--model", "no-such-model", "--max-queue", "0",
    ),
    "--under-load http://127.0.0.1:9": (
        "profile", "--model", "no-such-model", "--under-load", "http://127.0.0.1:9",
    ),
    "--rates": ("profile", "--model", "no-such-model", "--under-load", "x", "--rates", "0"),
}  # fmt: skip


@pytest.mark.parametrize("named", BAD_COMMAND_LINES)
def test_bad_command_lines_are_one_line_and_exit_2_before_any_model_loads(named, capsys):
    from server.cli import main

    assert not torch.cuda.is_available()  # "--device cuda" assumes a machine without one
    assert main(list(BAD_COMMAND_LINES[named])) == 2
    stderr = capsys.readouterr().err
    assert stderr.startswith(f"tidal: error: {named}") and stderr.count("\n") == 1, stderr


def test_a_busy_port_fails_at_once_naming_host_and_port():
    """A real process: one line, exit 2, before the model loads (it does not exist)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["worker", "--model", "no-such-model", "--port", str(port)]
        done = subprocess.run(
            [sys.executable, "-m", "server.cli", *argv],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"tidal: error: --host/--port: cannot listen on 127.0.0.1:{port} (Address already in use)"
    ]


def test_loadgen_replays_a_trace_open_loop(worker, tmp_path, capsys):
    from server.cli import main

    trace = tmp_path / "steady.csv"
    trace.write_text("timestamp,count\n" + "".join(f"{s},40\n" for s in range(10)))
    out = tmp_path / "results.csv"
    argv = ["loadgen", "--trace", str(trace), "--target", worker, "--duration", "2s"]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["by_status"] == {"200": summary["requests"]}
    assert 40 <= summary["requests"] <= 130  # Poisson around 80 in 2 s
    rows = out.read_text().splitlines()
    header = "scheduled_s,sent_s,status,latency_s,queue_wait_ms,batch_size,execution_ms"
    assert rows[0] == header + ",ingress_ms,padded_size"
    assert len(rows) == 1 + summary["requests"]
    assert 0 <= summary["ingress_ms"]["p50"] <= summary["ingress_ms"]["p99"]


def test_ingress_is_measured_from_the_clients_stamp_and_a_bad_stamp_is_422(worker):
    image_body = {"input": image(0)}
    sent = httpx.post(
        f"{worker}/v1/infer", json=image_body, headers={"x-sent-at": str(time.time() - 0.5)}
    )
    # Stamped half a second ago: that time was spent before the worker's handler.
    assert sent.status_code == 200 and sent.json()["timing"]["ingress_ms"] >= 500
    unstamped = httpx.post(f"{worker}/v1/infer", json=image_body)
    assert 0 <= unstamped.json()["timing"]["ingress_ms"] < 500
    for bad in ("nan", "inf", "soon"):
        refused = httpx.post(f"{worker}/v1/infer", json=image_body, headers={"x-sent-at": bad})
        assert refused.status_code == 422, bad
    scraped = httpx.get(f"{worker}/metrics").text
    assert "tidal_worker_ingress_seconds_count" in scraped


def test_profile_writes_json_that_simulate_loads(tmp_path, capsys):
    from server.cli import main as tidal
    from simulations.cli import main as simulate

    profile = tmp_path / "profile.json"
    argv = ["profile", "--model", "demo-cnn", "--batch-sizes", "1,2,4", "--runs", "3"]
    assert tidal([*argv, "--memory-budget", "64MiB", "--out", str(profile)]) == 0
    document = json.loads(profile.read_text())
    assert [p["batch_size"] for p in document["points"]] == [1, 2, 4]
    assert all(p["p99_ms"] >= p["mean_ms"] > 0 for p in document["points"])
    assert document["compiled"] is False  # demo-cnn's choice: no compile
    assert all(p["warmup_s"] > 0 for p in document["points"])
    memory = document["memory"]
    assert memory["device_bytes"] == 64 * 2**20 and memory["parameter_bytes"] > 1e6
    printed = capsys.readouterr().out
    assert "largest feasible batch" in printed
    assert re.search(r"^ batch .* items/s +gain +warm-up s$", printed, re.MULTILINE)
    assert re.search(r"^gain \d+\.\dx items/s from batch 1 to 4$", printed, re.MULTILINE)
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,count\n" + "".join(f"{s},100\n" for s in range(20)))
    assert simulate(["--trace", str(trace), "--latency-model", str(profile), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    # The file, and (when this machine's measurements came out non-monotone) the points
    # the monotone fit moved on loading: either is the profile, read as the planner reads it.
    assert re.fullmatch(
        re.escape(str(profile)) + r"( \(monotone fit moved batch [\d, ]+\))?",
        summary["latency_model"],
    )


def test_the_profile_table_says_items_per_second_the_gain_and_each_warm_up():
    from server.tools.profile import _table

    points = [(1, 0.004, 0.005), (8, 0.008, 0.010), (128, 0.064, 0.070)]
    lines = _table(points, None, [12.5, 2.0, 2.25]).splitlines()
    assert lines[0] == " batch   mean ms    p99 ms    items/s    gain  warm-up s"
    assert lines[1].split() == ["1", "4.000", "5.000", "250", "1.0x", "12.50"]
    assert lines[2].split() == ["8", "8.000", "10.000", "1000", "4.0x", "2.00"]
    assert lines[3].split() == ["128", "64.000", "70.000", "2000", "8.0x", "2.25"]
    assert lines[4] == "gain 8.0x items/s from batch 1 to 128"
    under_load = _table(points, None).splitlines()  # no warm-ups: no such column
    assert under_load[0].split()[-1] == "gain" and under_load[4] == lines[4]


def test_profile_under_load_reads_the_batches_a_serving_worker_ran(worker, tmp_path, capsys):
    from server.cli import main as tidal
    from simulations.cli import main as simulate

    served = tmp_path / "served.json"
    argv = ["profile", "--model", "demo-cnn", "--under-load", worker, "--rates", "150"]
    assert tidal([*argv, "--seconds", "2", "--runs", "3", "--out", str(served)]) == 0
    document = json.loads(served.read_text())
    assert document["failed"] == 0 and document["requests"] > 150
    sizes = [p["batch_size"] for p in document["points"]]
    assert sizes and set(sizes) <= {1, 2, 4, 8}  # padded to the worker's buckets, cap 8
    assert all(p["p99_ms"] >= p["mean_ms"] > 0 and p["batches"] >= 3 for p in document["points"])
    assert "batches per size" in capsys.readouterr().out
    (at_150,) = document["request_overhead_ms"]
    quantiles = at_150["quantiles"]
    assert at_150["rate_rps"] == 150 and len(quantiles) == len(at_150["levels"])
    assert quantiles == sorted(quantiles) and quantiles[0] >= 0
    trace = tmp_path / "t.csv"
    trace.write_text("timestamp,count\n" + "".join(f"{s},50\n" for s in range(20)))
    assert simulate(["--trace", str(trace), "--latency-model", str(served), "--json"]) == 0


def test_profile_under_load_of_a_pool_records_the_rate_each_worker_was_offered(worker, tmp_path):
    """Two workers (here the same one twice) share 120 req/s in turn: the overhead is
    recorded at 60 req/s a worker, the unit the simulator and the planner read."""
    from server.cli import main as tidal

    served = tmp_path / "pool.json"
    argv = ["profile", "--model", "demo-cnn", "--under-load", f"{worker},{worker}"]
    argv += ["--rates", "120", "--seconds", "1.5", "--runs", "1", "--out", str(served)]
    assert tidal(argv) == 0
    document = json.loads(served.read_text())
    assert document["workers"] == 2
    assert [entry["rate_rps"] for entry in document["request_overhead_ms"]] == [60]


def test_loadgen_exits_1_when_requests_fail_and_says_how_many(tmp_path, capsys):
    from server.cli import main

    trace = tmp_path / "steady.csv"
    trace.write_text("timestamp,count\n0,20\n1,20\n")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        target = f"http://127.0.0.1:{closed.getsockname()[1]}"
    argv = ["loadgen", "--trace", str(trace), "--target", target, "--duration", "1s", "--json"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "requests failed (by status: -1: " in err and "--max-failed 0.01" in err
    assert main([*argv, "--max-failed", "1"]) == 0  # failures reported, not fatal


def test_the_demo_finds_a_taken_port_before_it_profiles(capsys):
    from server.cli import main

    root = Path(__file__).resolve().parent.parent
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["demo", "--trace", str(root / "examples" / "promo_day.csv")]
        assert main([*argv, "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "tidal: error: --port (the API, then its two workers): cannot listen on "
        f"127.0.0.1:{port} (Address already in use)"
    )
