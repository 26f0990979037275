"""The Grafana dashboard and the alerting rules, proven on a real Prometheus.

A real `prometheus` (Debian's package; its own config, port and data folder in a temp
dir, on 127.0.0.1) scrapes a real controller and its two workers while a load
generator keeps them busy; every PromQL expression of docs/grafana/tidal.json must then
return data through Prometheus's HTTP API, so a renamed metric fails here instead of
leaving a blank panel. Both processes' `/metrics` pass `promtool check metrics` (the
exposition lint: counters end in `_total`, no `_bucket` or `_count` on what is not a
histogram, help text, base units). The alerting rules pass `promtool check rules` and
their unit tests (`promtool test rules`), and load into the running Prometheus.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from processes import free_ports, start_controller, stop, wait_for

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "docs" / "grafana" / "tidal.json"
RULES = ROOT / "docs" / "prometheus"
POOL = "promo"
# What Grafana substitutes for the dashboard's variables, at a 1 s scrape interval.
VARIABLES = {
    "$__rate_interval": "10s",
    "$__range": "1m",
    "$pool": POOL,
    "$instance": ".*",
    "$slo": "0.1",
}


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: apt-get install prometheus (.ci/run installs it)")
    return path


def dashboard_expressions() -> list[tuple[str, str]]:
    """(panel title, expression) for every query of the dashboard."""

    def panels(items):
        for panel in items:
            yield panel
            yield from panels(panel.get("panels", []))

    document = json.loads(DASHBOARD.read_text())
    return [
        (panel.get("title", "?"), target["expr"])
        for panel in panels(document["panels"])
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


@dataclass(frozen=True)
class Scraped:
    """The running Prometheus and the targets it scrapes."""

    url: str
    controller: str
    workers: list[str]


def substituted(expression: str) -> str:
    for name, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expression = expression.replace(name, value)
    return expression


def test_the_alerting_rules_check_and_pass_their_unit_tests():
    promtool = tool("promtool")
    for argv in (["check", "rules", "tidal-rules.yml"], ["test", "rules", "tidal-rules.test.yml"]):
        done = subprocess.run(
            [promtool, *argv], cwd=RULES, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A controller with two local workers under load, and a Prometheus scraping them."""
    binary = tool("prometheus")
    folder = tmp_path_factory.mktemp("prometheus")
    api_port = free_ports(4)  # the API, its two local workers, then Prometheus
    worker_port, prometheus_port = api_port + 1, api_port + 3
    workers = [f"127.0.0.1:{worker_port + i}" for i in range(2)]
    controller = start_controller(
        [
            "--redis", "none", "--pool", POOL, "--policy", "predictive:step=2s",
            "--workers", "2", "--latency-model", "linear:5,0.4", "--tick", "0.5s",
            "--port", str(api_port), "--local-workers", "2", "--worker-port", str(worker_port),
        ],
        folder / "controller.log",
    )  # fmt: skip
    api = f"http://127.0.0.1:{api_port}"
    processes = [controller]
    try:
        ready = lambda: httpx.get(f"{api}/readyz").status_code == 200  # noqa: E731
        wait_for(ready, 90, "the controller", process=controller, log=folder / "controller.log")
        trace = folder / "steady.csv"
        trace.write_text("timestamp,count\n" + "".join(f"{s},30\n" for s in range(120)))
        processes.append(
            subprocess.Popen(
                [
                    sys.executable, "-m", "server.cli", "loadgen", "--trace", str(trace),
                    "--target", ",".join(f"http://{w}" for w in workers), "--duration", "90s",
                    "--json",
                ],
                stdout=subprocess.DEVNULL,
            )
        )  # fmt: skip
        shutil.copy(RULES / "tidal-rules.yml", folder / "tidal-rules.yml")
        (folder / "prometheus.yml").write_text(
            json.dumps(  # JSON is YAML
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": ["tidal-rules.yml"],
                    "scrape_configs": [
                        {
                            "job_name": "tidal-controller",
                            "static_configs": [{"targets": [f"127.0.0.1:{api_port}"]}],
                        },
                        {
                            "job_name": "tidal-worker",
                            "static_configs": [{"targets": workers, "labels": {"pool": POOL}}],
                        },
                    ],
                }
            )
        )
        processes.append(
            subprocess.Popen(
                [
                    binary, f"--config.file={folder / 'prometheus.yml'}",
                    f"--storage.tsdb.path={folder / 'data'}",
                    f"--web.listen-address=127.0.0.1:{prometheus_port}",
                ],
                stdout=(folder / "prometheus.log").open("w"),
                stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
        url = f"http://127.0.0.1:{prometheus_port}"
        wait_for(lambda: len(query(url, "up == 1")) == 3, 60, "Prometheus scraping 3 targets")
        yield Scraped(url, api, [f"http://{w}" for w in workers])
    finally:
        for process in reversed(processes):
            stop(process)


def query(url: str, expression: str) -> list:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expression}, timeout=10).json()
    assert answer["status"] == "success", (expression, answer)
    return answer["data"]["result"]


def test_every_dashboard_expression_returns_data(prometheus):
    expressions = dashboard_expressions()
    assert len(expressions) > 30
    missing = {}
    deadline = time.monotonic() + 60  # the forecast, rates and decisions need some seconds
    for title, expression in expressions:
        promql = substituted(expression)
        while not query(prometheus.url, promql) and time.monotonic() < deadline:
            time.sleep(1)
        if not query(prometheus.url, promql):
            missing[title] = promql
    assert not missing, f"panels without data: {json.dumps(missing, indent=1)}"


def test_the_alerting_rules_load_and_evaluate_on_live_series(prometheus):
    groups = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert {g["name"] for g in groups} == {"tidal-slo", "tidal-control"}
    assert all(rule["health"] == "ok" for rule in rules), [r for r in rules if r["health"] != "ok"]
    # The recording rule reads the workers' real histograms, per pool. How many miss is a
    # figure of the machine (a loaded 2-core CI box shares its cores between Prometheus,
    # the load, the planner's table and both workers), so it is a share, not a bound here.
    ratio = wait_for(lambda: query(prometheus.url, "tidal:slo_miss_ratio:rate5m"), 30, "the ratio")
    assert ratio[0]["metric"]["pool"] == POOL and 0 <= float(ratio[0]["value"][1]) <= 1
    firing = query(prometheus.url, 'ALERTS{alertstate="firing"}')
    assert not firing, firing  # one leader, workers alive, no tick errors, SLO met


def exposition(target: str, series: str) -> str:
    """`target`'s /metrics once it holds `series`."""

    def scraped() -> str | None:
        text = httpx.get(f"{target}/metrics", timeout=10).text
        return text if series in text else None

    return wait_for(scraped, 30, f"{series} at {target}/metrics")


def test_both_processes_metrics_pass_promtool_check_metrics(prometheus):
    """The lint Prometheus ships, on the live exposition of the controller and of both
    workers, once the load has been served and the controller has decided (the labelled
    families have series then)."""
    promtool = tool("promtool")
    expected = {prometheus.controller: "tidal_controller_decisions_total{"}
    expected |= dict.fromkeys(prometheus.workers, 'tidal_worker_requests_total{outcome="ok"}')
    for target, series in expected.items():
        done = subprocess.run(
            [promtool, "check", "metrics"],
            input=exposition(target, series),
            capture_output=True,
            text=True,
            timeout=60,
        )
        lint = done.stdout + done.stderr
        assert done.returncode == 0 and not lint, f"{target}/metrics: {lint}"
