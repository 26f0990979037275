"""A Triton model in a Tidal pool, with real processes: Redis, tritonserver, the
controller and `tidal engine triton`, under steady open-loop load over gRPC.

The tritonserver is the one the nvidia-pytriton wheel carries, serving
examples/triton/models (a python-backend model whose execution sleeps 10 ms + 1 ms per
item; a sleep stands in for compute honestly here: what is steered is how Triton forms
batches). It starts once for the module, and the tests run on one timeline, in order:

1. stats flow into the pool's API (a member with engine "triton") and /metrics;
2. a step in load declared through the API: the controller raises the cap, and Triton
   serves it (reloaded) before the step, and the decision log says why;
3. five operator overrides in a row under load: each is loaded and read back, and no
   request fails;
4. an override Triton refuses (a cap above what the model's inputs take) is reported in
   the heartbeat and the pool's API, and the old config keeps serving;
5. Triton restarts: it comes back with its disk config, and the engine loads the pool's
   config again.

Like tests/test_end_to_end.py, the controller plans with a declared step of 20x while
the real load stays at 20 req/s, so the 2-core machine is not overrun: raising the cap
before the step can only come from the forecast. The last tests read captured /metrics
text in process: counters across a reload, and a restart that resets them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import tritonclient.grpc as triton_grpc
from prometheus_client.parser import text_string_to_metric_families
from redis_server import RedisProcess, free_port

from adaptive.histogram import BUCKET_LOWER_S, NUM_BUCKETS, quantile_from_counts
from server.engines.triton import (
    BatchCounts,
    Knobs,
    Snapshot,
    parse_batch_stats,
    parse_metrics,
    window_stats,
)
from server.engines.triton_local import Outcome, TritonProcess, replay, steady_arrivals

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "triton" / "models"
POOL = "triton"
MODEL = "tidal_sleep"
MEMBER = "triton-0"
TOKEN = "triton-secret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
RATE_RPS = 20.0
DISK = Knobs(8, 5000)  # examples/triton/models/tidal_sleep/config.pbtxt


def tidal(*argv: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "server.cli", *argv],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def wait_for(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = condition()
        except (httpx.HTTPError, triton_grpc.InferenceServerException):
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class Load(threading.Thread):
    """Poisson arrivals at RATE_RPS over gRPC, open loop, until stopped."""

    def __init__(self, grpc_url: str) -> None:
        super().__init__(daemon=True)
        self.grpc_url = grpc_url
        self.outcomes: list[Outcome] = []
        self.started = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._halt: asyncio.Event | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        self._loop, self._halt = asyncio.get_running_loop(), asyncio.Event()
        self.started.set()
        arrivals = steady_arrivals(RATE_RPS, 3600.0)
        await replay(self.grpc_url, MODEL, arrivals, stop=self._halt, record=self.outcomes)

    def stop(self) -> None:
        if not self.is_alive():
            return
        if self._loop is not None and self._halt is not None:
            self._loop.call_soon_threadsafe(self._halt.set)
        self.join(60)

    def failures(self) -> list[Outcome]:
        return [o for o in list(self.outcomes) if o.error is not None]

    def served(self) -> int:
        return sum(1 for o in list(self.outcomes) if o.error is None)


@dataclass
class Fleet:
    api: str
    redis_url: str
    triton: TritonProcess
    load: Load
    processes: dict[str, subprocess.Popen]
    tmp: Path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("triton")
    repository = tmp / "models"  # a copy: the python backend writes __pycache__ beside it
    shutil.copytree(EXAMPLES, repository, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp / "token").write_text(TOKEN)
    redis = RedisProcess()
    redis.start()
    port = free_port()
    processes = {
        "controller": tidal(
            "controller", "--redis", redis.url, "--pool", POOL,
            "--policy", "predictive:step=2s", "--workers", "1",
            "--latency-model", "linear:10,1", "--slo", "100ms", "--tick", "0.5s",
            "--lease", "1s", "--reload", "3s", "--guard", "dwell=3s",
            "--token-file", str(tmp / "token"), "--port", str(port), "--name", "c",
            log=tmp / "controller.log",
        ),
    }  # fmt: skip
    triton = TritonProcess(repository, [MODEL], log_path=tmp / "tritonserver.log")
    load = Load(triton.grpc_url)
    try:
        triton.start()
        processes["engine"] = tidal(
            "engine", "triton", "--redis", redis.url, "--pool", POOL,
            "--grpc", triton.grpc_url, "--metrics", triton.metrics_url,
            "--model", MODEL, "--name", MEMBER,
            log=tmp / "engine.log",
        )  # fmt: skip
        api = f"http://127.0.0.1:{port}"
        wait_for(lambda: httpx.get(f"{api}/readyz").status_code == 200, 60, "controller ready")
        wait_for(lambda: pool(api)["engines"] == {"triton": 1}, 30, "the triton member")
        load.start()
        load.started.wait(10)
        yield Fleet(api, redis.url, triton, load, processes, tmp)
    finally:
        # Every step runs even if one before it fails: a tritonserver must never outlive
        # the test (ExitStack runs them last-registered first, raising at the end).
        with contextlib.ExitStack() as cleanup:
            cleanup.callback(redis.stop)
            cleanup.callback(triton.close)
            cleanup.callback(stop_all, processes)
            cleanup.callback(load.stop)


def stop_all(processes: dict[str, subprocess.Popen]) -> None:
    for process in processes.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes.values():
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()


def pool(api: str) -> dict:
    return httpx.get(f"{api}/v1/pools/{POOL}", timeout=2).json()


def workers(api: str) -> list[dict]:
    return httpx.get(f"{api}/v1/pools/{POOL}/workers", timeout=2).json()["workers"]


def heartbeat(fleet: Fleet) -> dict | None:
    """The member's heartbeat as the bus holds it (what GET .../workers shows)."""
    client = redis.Redis.from_url(fleet.redis_url, decode_responses=True)
    try:
        text = client.get(f"tidal:{POOL}:worker:{MEMBER}")
    finally:
        client.close()
    return json.loads(text) if text else None


def forecast_actual(fleet: Fleet) -> list[dict]:
    return httpx.get(f"{fleet.api}/v1/pools/{POOL}/forecast", timeout=2).json()["actual"]


def serving(fleet: Fleet) -> Knobs:
    """What Triton itself says it serves, read back over gRPC."""
    client = triton_grpc.InferenceServerClient(fleet.triton.grpc_url)
    try:
        return Knobs.read(client.get_model_config(MODEL, as_json=True)["config"])
    finally:
        client.close()


def pin(fleet: Fleet, max_batch: int, timeout_ms: float) -> dict:
    body = {"max_batch": max_batch, "timeout_ms": timeout_ms, "duration": "10m", "reason": "t"}
    answer = httpx.put(f"{fleet.api}/v1/pools/{POOL}/override", json=body, headers=AUTH)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_stats_flow_into_the_pool_api_and_the_controller_metrics(fleet):
    def observed():
        decision = pool(fleet.api)["last_decision"] or {}
        inputs = decision.get("inputs") or {}
        # the first windows may hold the load's first second only: wait for a full one
        full = inputs.get("rate_rps", 0) > RATE_RPS / 3
        return full and inputs.get("p99_ms") and inputs.get("mean_batch_size") and inputs

    inputs = wait_for(observed, 30, "a decision on Triton's stats at the load's rate")
    assert inputs["rate_rps"] < RATE_RPS * 3, inputs
    assert 0 < inputs["utilization"] < 1 and inputs["shed"] == 0
    assert 10 < inputs["p99_ms"] < 1000  # the model sleeps 10 ms + 1 ms per item
    summary = pool(fleet.api)
    assert summary["engines"] == {"triton": 1} and summary["workers_alive"] == 1
    beat = heartbeat(fleet)
    assert beat["engine"] == "triton" and beat["model"] == MODEL
    assert beat["change_cost"]["reload_s"] > 0 and beat["warmed_buckets"] is None
    wait_for(
        lambda: heartbeat(fleet)["serving_max_batch"] == pool(fleet.api)["config"]["max_batch"],
        15,
        "the member serving the pool's cap (a reload may be under way)",
    )
    wait_for(  # arrivals reach the forecast's history, a step (2 s) at a time
        lambda: sum(p["rps"] for p in forecast_actual(fleet)[-5:]) > RATE_RPS / 4,
        15,
        "arrivals in the forecast's history",
    )
    families = {
        f.name: f for f in text_string_to_metric_families(httpx.get(f"{fleet.api}/metrics").text)
    }
    members = {s.labels["engine"]: s.value for s in families["tidal_controller_members"].samples}
    assert members == {"triton": 1.0}
    assert fleet.load.failures() == []


def test_the_workers_api_shows_the_triton_members_last_window(fleet):
    seen = next(w for w in workers(fleet.api) if w["name"] == MEMBER)
    assert seen["engine"] == "triton" and seen["last_stats"]["completed"] > 0


def test_a_declared_step_is_met_by_a_reload_before_it(fleet):
    # Before the step is declared the pool settles on batch 8 or less for 20 req/s (the
    # controller starts at 32); 20x that (400 req/s) needs 16 or more.
    wait_for(lambda: pool(fleet.api)["config"]["max_batch"] <= 8, 30, "a small cap at 20 req/s")
    wait_for(lambda: serving(fleet).max_batch_size <= 8, 15, "Triton serving it")
    step_at = time.time() + 18.0
    step = {"name": "step", "start": step_at, "end": step_at + 600, "multiplier": 20}
    declared = httpx.post(
        f"{fleet.api}/v1/pools/{POOL}/events", json={"events": [step]}, headers=AUTH
    )
    assert declared.status_code == 200, declared.text
    raised = wait_for(lambda: serving(fleet).max_batch_size >= 16 and serving(fleet), 20, "a raise")
    in_force_at = time.time()
    assert in_force_at < step_at, f"the raise to {raised} came {in_force_at - step_at:.1f}s late"
    records = httpx.get(f"{fleet.api}/v1/pools/{POOL}/decisions", params={"limit": 500}).json()
    ahead = [
        r
        for r in records["decisions"]
        if r["time"] < step_at and r["chosen"]["max_batch"] >= 16 and r["kind"] != "override"
    ]
    assert ahead, "no decision raised the cap before the step"
    assert "forecast upper bound" in ahead[-1]["reason"], ahead[-1]["reason"]
    deleted = httpx.delete(f"{fleet.api}/v1/pools/{POOL}/events", headers=AUTH)
    assert deleted.status_code == 200
    assert fleet.load.failures() == []


def test_five_overrides_under_load_fail_no_request(fleet):
    served_before = fleet.load.served()
    configs = [(4, 2.0), (12, 1.0), (2, 0.0), (16, 4.0), (6, 3.0)]
    for max_batch, timeout_ms in configs:
        version = pin(fleet, max_batch, timeout_ms)["override"]
        wanted = Knobs(max_batch, round(timeout_ms * 1e3))
        wait_for(lambda w=wanted: serving(fleet) == w, 20, f"Triton serving {wanted}")
        wait_for(
            lambda: heartbeat(fleet)["config_version"] == pool(fleet.api)["version"],
            10,
            f"the member reporting the version of {version}",
        )
    seen = heartbeat(fleet)
    assert seen["reloads"] >= len(configs)
    assert 0.5 < seen["change_cost"]["reload_s"] < 10
    assert fleet.load.served() - served_before > 5 * RATE_RPS
    assert fleet.load.failures() == []


def test_an_override_triton_refuses_is_reported_and_the_old_config_serves(fleet):
    before = serving(fleet)
    pin(fleet, 128, 2.0)  # the model's inputs take at most 64
    refusal = wait_for(lambda: pool(fleet.api)["refusing"].get(MEMBER), 20, "the refusal")
    assert refusal["config"].startswith("max_batch=128")
    assert "above what this model's inputs take (64)" in refusal["reason"], refusal
    assert heartbeat(fleet)["rejected"]["version"] == refusal["version"]
    assert serving(fleet) == before
    pin(fleet, 8, 2.0)  # a newer config that it takes clears the refusal
    wait_for(lambda: not pool(fleet.api)["refusing"], 20, "the refusal to clear")
    assert serving(fleet) == Knobs(8, 2000)
    assert fleet.load.failures() == []


def test_a_restarted_triton_gets_the_pools_config_again(fleet):
    fleet.load.stop()  # requests fail while Triton is down; every one before did not
    assert fleet.load.failures() == [] and fleet.load.served() > 0
    pinned = Knobs(8, 2000)
    assert serving(fleet) == pinned
    fleet.triton.stop()
    fleet.triton.start()  # the same ports; the override is gone
    wait_for(lambda: serving(fleet) == pinned, 30, "the engine to load the pool's config again")
    seen = wait_for(lambda: (m := heartbeat(fleet)) and m["restarts_detected"] >= 1 and m, 10, "")
    assert seen["config_version"] == pool(fleet.api)["version"]
    lifted = httpx.delete(f"{fleet.api}/v1/pools/{POOL}/override", headers=AUTH)
    assert lifted.status_code == 200


# -- in process: the counters' deltas on /metrics text captured from this tritonserver --

SCRAPE_BEFORE = """\
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="tidal_sleep",version="1"} 94913
nv_inference_request_failure{model="tidal_sleep",reason="OTHER",version="1"} 0
nv_inference_request_failure{model="tidal_sleep",reason="BACKEND",version="1"} 0
nv_inference_request_failure{model="tidal_sleep",reason="CANCELED",version="1"} 0
nv_inference_request_failure{model="tidal_sleep",reason="REJECTED",version="1"} 0
nv_inference_count{model="tidal_sleep",version="1"} 94913
nv_inference_exec_count{model="tidal_sleep",version="1"} 38237
nv_inference_request_duration_us{model="tidal_sleep",version="1"} 2235438922
nv_inference_queue_duration_us{model="tidal_sleep",version="1"} 795804070
nv_inference_compute_input_duration_us{model="tidal_sleep",version="1"} 7839951
nv_inference_compute_infer_duration_us{model="tidal_sleep",version="1"} 1346374361
nv_inference_compute_output_duration_us{model="tidal_sleep",version="1"} 82478011
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="tidal_sleep",version="1"} 0
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.5"} 18010
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.9"} 26141
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.95"} 29624
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.99"} 48550
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.999"} 80232
"""

SCRAPE_AFTER_RELOAD = """\
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="tidal_sleep",version="1"} 95025
nv_inference_request_failure{model="tidal_sleep",reason="OTHER",version="1"} 0
nv_inference_request_failure{model="tidal_sleep",reason="BACKEND",version="1"} 0
nv_inference_request_failure{model="tidal_sleep",reason="CANCELED",version="1"} 0
nv_inference_request_failure{model="tidal_sleep",reason="REJECTED",version="1"} 0
nv_inference_count{model="tidal_sleep",version="1"} 95025
nv_inference_exec_count{model="tidal_sleep",version="1"} 38337
nv_inference_request_duration_us{model="tidal_sleep",version="1"} 2237556770
nv_inference_queue_duration_us{model="tidal_sleep",version="1"} 796366151
nv_inference_compute_input_duration_us{model="tidal_sleep",version="1"} 7846164
nv_inference_compute_infer_duration_us{model="tidal_sleep",version="1"} 1347844391
nv_inference_compute_output_duration_us{model="tidal_sleep",version="1"} 82556126
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="tidal_sleep",version="1"} 0
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.5"} 17545
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.9"} 26141
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.95"} 30424
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.99"} 68016
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.999"} 85686
"""

SCRAPE_AFTER_RESTART = """\
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="tidal_sleep",version="1"} 23
nv_inference_request_failure{model="tidal_sleep",reason="OTHER",version="1"} 0
nv_inference_request_failure{model="tidal_sleep",reason="BACKEND",version="1"} 0
nv_inference_request_failure{model="tidal_sleep",reason="CANCELED",version="1"} 0
nv_inference_request_failure{model="tidal_sleep",reason="REJECTED",version="1"} 0
nv_inference_count{model="tidal_sleep",version="1"} 23
nv_inference_exec_count{model="tidal_sleep",version="1"} 19
nv_inference_request_duration_us{model="tidal_sleep",version="1"} 561373
nv_inference_queue_duration_us{model="tidal_sleep",version="1"} 196306
nv_inference_compute_input_duration_us{model="tidal_sleep",version="1"} 1696
nv_inference_compute_infer_duration_us{model="tidal_sleep",version="1"} 353888
nv_inference_compute_output_duration_us{model="tidal_sleep",version="1"} 9151
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="tidal_sleep",version="1"} 0
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.5"} 18191
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.9"} 28984
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.95"} 31501
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.99"} 31528
nv_inference_request_summary_us{model="tidal_sleep",version="1",quantile="0.999"} 31528
"""

STATISTICS_BEFORE = {
    "model_stats": [
        {
            "name": "tidal_sleep",
            "version": "1",
            "batch_stats": [
                {
                    "batch_size": "1",
                    "compute_input": {"count": "25", "ns": "1673313"},
                    "compute_infer": {"count": "25", "ns": "379331320"},
                    "compute_output": {"count": "25", "ns": "12981055"},
                },
                {
                    "batch_size": "2",
                    "compute_input": {"count": "14", "ns": "3872474"},
                    "compute_infer": {"count": "14", "ns": "190604265"},
                    "compute_output": {"count": "14", "ns": "7603245"},
                },
            ],
        }
    ]
}
STATISTICS_AFTER_RELOAD = {
    "model_stats": [
        {
            "name": "tidal_sleep",
            "version": "1",
            "batch_stats": [
                {
                    "batch_size": "1",
                    "compute_input": {"count": "33", "ns": "1925160"},
                    "compute_infer": {"count": "33", "ns": "464404370"},
                    "compute_output": {"count": "33", "ns": "25917814"},
                },
                {
                    "batch_size": "2",
                    "compute_input": {"count": "1", "ns": "58489"},
                    "compute_infer": {"count": "1", "ns": "17420915"},
                    "compute_output": {"count": "1", "ns": "385009"},
                },
                {
                    "batch_size": "3",
                    "compute_input": {"count": "1", "ns": "74479"},
                    "compute_infer": {"count": "1", "ns": "13967016"},
                    "compute_output": {"count": "1", "ns": "779786"},
                },
                {
                    "batch_size": "4",
                    "compute_input": {"count": "1", "ns": "77164"},
                    "compute_infer": {"count": "1", "ns": "15713717"},
                    "compute_output": {"count": "1", "ns": "724683"},
                },
            ],
        }
    ]
}


def snapshot(scrape: str, statistics: dict | None = None) -> Snapshot:
    batches = parse_batch_stats(statistics, MODEL) if statistics is not None else None
    return Snapshot(parse_metrics(scrape, MODEL), batches)


def window(before: Snapshot, after: Snapshot):
    return window_stats(before, after, worker="w", window_s=1.0, max_batch_size=6, config_version=3)


def test_the_scrape_is_read_per_model():
    counters = parse_metrics(SCRAPE_BEFORE, MODEL)
    assert (counters.success, counters.executions, counters.pending) == (94913, 38237, 0)
    assert [q for q, _ in counters.quantiles_us] == [0.5, 0.9, 0.95, 0.99, 0.999]
    assert parse_metrics(SCRAPE_BEFORE, "another") == parse_metrics("", MODEL)
    unseen = SCRAPE_BEFORE.replace('quantile="0.99"} 48550', 'quantile="0.99"} Nan')
    assert 0.99 not in dict(parse_metrics(unseen, MODEL).quantiles_us)


def test_counters_run_on_across_a_reload_and_batch_figures_fall_back_to_means():
    stats, figures = window(
        snapshot(SCRAPE_BEFORE, STATISTICS_BEFORE),
        snapshot(SCRAPE_AFTER_RELOAD, STATISTICS_AFTER_RELOAD),
    )
    assert not figures.restarted
    assert not figures.exact_batches  # the reload reset the statistics API (size 2: 14 -> 1)
    assert (stats.arrivals, stats.completed, stats.shed) == (112, 112, 0)
    assert (stats.batches, stats.batch_size_sum) == (100, 112)
    assert stats.batch_sizes == ((1, 100),)  # one entry at the rounded mean (1.12)
    assert stats.latency_sum_s == pytest.approx(2.117848)
    compute_s = (7846164 - 7839951 + 1347844391 - 1346374361 + 82556126 - 82478011) / 1e6
    assert stats.busy_s == pytest.approx(compute_s * 100 / 112)
    assert stats.fill_sum == pytest.approx(112 / 6)
    assert stats.warmed_buckets is None and stats.config_version == 3


def test_a_restart_resets_the_counters_and_the_window_counts_from_zero():
    stats, figures = window(
        snapshot(SCRAPE_AFTER_RELOAD, STATISTICS_AFTER_RELOAD), snapshot(SCRAPE_AFTER_RESTART)
    )
    assert figures.restarted and not figures.exact_batches
    assert (stats.completed, stats.batches, stats.batch_size_sum) == (23, 19, 23)
    assert stats.latency_sum_s == pytest.approx(0.561373)


def test_batch_sizes_and_busy_time_are_exact_while_the_statistics_run_on():
    before = snapshot(SCRAPE_BEFORE, STATISTICS_BEFORE)
    after = Snapshot(
        parse_metrics(SCRAPE_AFTER_RELOAD, MODEL),
        BatchCounts(
            (
                (1, 25 + 5, 394_000_000 + 5 * 15_000_000),
                (2, 14 + 6, 202_000_000 + 6 * 16_000_000),
                (4, 1, 18_000_000),
            )
        ),
    )
    before = Snapshot(
        before.counters,
        BatchCounts(((1, 25, 394_000_000), (2, 14, 202_000_000))),
    )
    stats, figures = window(before, after)
    assert figures.exact_batches
    assert stats.batch_sizes == ((1, 5), (2, 6), (4, 1))
    assert (stats.batches, stats.batch_size_sum) == (12, 21)
    assert stats.busy_s == pytest.approx((5 * 15 + 6 * 16 + 18) / 1e3)


def test_the_window_histogram_has_the_summarys_quantiles():
    counters = parse_metrics(SCRAPE_BEFORE, MODEL)
    stats, _ = window(snapshot(SCRAPE_BEFORE), snapshot(SCRAPE_AFTER_RELOAD))
    counts = np.zeros(NUM_BUCKETS, dtype=np.int64)
    for bucket, n in stats.latency_buckets:
        counts[bucket] += n
    assert counts.sum() == stats.completed
    summary = dict(parse_metrics(SCRAPE_AFTER_RELOAD, MODEL).quantiles_us)
    for q in (0.5, 0.99):
        assert quantile_from_counts(counts, q) == pytest.approx(summary[q] / 1e6, rel=0.02)
    assert counters.quantiles_us  # and without a summary, all at the window's mean:
    bare = "\n".join(line for line in SCRAPE_AFTER_RELOAD.splitlines() if "summary" not in line)
    stats, _ = window(snapshot(SCRAPE_BEFORE), snapshot(bare))
    assert len(stats.latency_buckets) == 1 and stats.latency_buckets[0][1] == 112
    mean_s = stats.latency_sum_s / stats.completed
    assert (
        BUCKET_LOWER_S[stats.latency_buckets[0][0]]
        <= mean_s
        < BUCKET_LOWER_S[stats.latency_buckets[0][0] + 1]
    )
