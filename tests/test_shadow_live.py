"""A real `tidal controller` (two local workers, real HTTP) on a static policy with a
predictive shadow, steered through its API as an operator trying predictive would:
switched, pinned, unpinned, given an event and relieved of it, and switched back. It
stays ready, no tick fails, and the shadow's decisions are on the record throughout.
Before issue 2/5 every tick of such a controller failed at its step."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
from processes import free_ports, start_controller, stop, wait_for
from prometheus_client.parser import text_string_to_metric_families

TOKEN = "shadow-secret"
AUTH = {"authorization": f"Bearer {TOKEN}"}
STATIC = "static:max_batch=16,timeout=5ms"


def test_a_live_static_pool_with_a_predictive_shadow_stays_ready_through_operator_changes(
    tmp_path,
):
    (tmp_path / "token").write_text(TOKEN)
    trace = tmp_path / "flat.csv"
    trace.write_text("timestamp,count\n" + "".join(f"{s},30\n" for s in range(60)))
    port = free_ports(3)
    api = f"http://127.0.0.1:{port}"
    workers = [f"http://127.0.0.1:{port + 1}", f"http://127.0.0.1:{port + 2}"]
    log = tmp_path / "controller.log"
    args = ["--pool", "p", "--policy", STATIC, "--shadow", "predictive", "--tick", "0.5s"]
    args += ["--local-workers", "2", "--model", "demo-cnn", "--port", str(port)]
    args += ["--worker-port", str(port + 1), "--token-file", str(tmp_path / "token")]
    controller = start_controller(args, log)
    load = None
    try:
        ready = lambda: httpx.get(f"{api}/readyz").status_code == 200  # noqa: E731
        wait_for(ready, 120, "the controller ready", process=controller, log=log)
        load = subprocess.Popen(
            [sys.executable, "-m", "server.cli", "loadgen", "--trace", str(trace),
             "--target", ",".join(workers), "--model", "demo-cnn", "--duration", "60s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        with httpx.Client(base_url=api, headers=AUTH, timeout=30) as client:

            def shadow_decided():
                return (client.get("/v1/pools/p").json()["last_decision"] or {}).get("shadow")

            wait_for(
                shadow_decided, 30, "a decision with the shadow's", process=controller, log=log
            )
            now = time.time()
            event = {"name": "sale", "start": now + 60, "end": now + 600, "multiplier": 3}
            steps = [
                ("put", "/policy", {"policy": "aimd"}),
                ("put", "/override", {"max_batch": 4, "timeout_ms": 2, "duration": "10m"}),
                ("delete", "/override", None),
                ("post", "/events", {"events": [event]}),
                ("delete", "/events", None),
                ("put", "/policy", {"policy": STATIC}),
            ]
            for method, path, body in steps:
                answer = client.request(method, f"/v1/pools/p{path}", json=body)
                assert answer.status_code == 200, (path, answer.text)
                time.sleep(2.0)  # a few ticks on each
            status = client.get("/v1/pools/p").json()
            decisions = client.get("/v1/pools/p/decisions", params={"count": 500}).json()[
                "decisions"
            ]
        ready = httpx.get(f"{api}/readyz")
        metrics = text_string_to_metric_families(httpx.get(f"{api}/metrics").text)
    finally:
        if load is not None:
            load.kill()
            load.wait()
        stop(controller)
    errors = {
        sample.labels["stage"]: sample.value
        for family in metrics
        if family.name == "tidal_controller_tick_errors"
        for sample in family.samples
        if sample.name.endswith("_total")
    }
    assert ready.status_code == 200 and status["ready"] and status["last_error"] is None
    assert errors and not any(errors.values()), errors
    assert status["policy"] == STATIC and status["shadow"] == "predictive"
    assert status["jobs"]["failed"] == {}
    shadows = [d["shadow"] for d in decisions if d.get("shadow")]
    assert shadows and all(s["policy"] == "predictive" for s in shadows)
    assert {d["policy"].split(":")[0] for d in decisions} >= {"static", "aimd"}
