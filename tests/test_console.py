"""The operator console in a real browser (Debian's Chromium, driven by Playwright)
against a real controller with two workers under load."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright
from processes import free_ports, start_controller, stop, wait_for

POOL = "promo"
TOKEN = "console-s3cret"
CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="module")
def controller(tmp_path_factory):
    folder = tmp_path_factory.mktemp("console")
    (folder / "token").write_text(TOKEN)
    api_port = free_ports(3)  # the API, then its two local workers
    worker_port = api_port + 1
    process = start_controller(
        [
            "--redis", "none", "--pool", POOL, "--policy", "predictive:step=2s",
            "--workers", "2", "--tick", "0.5s", "--token-file", str(folder / "token"),
            "--port", str(api_port), "--local-workers", "2", "--worker-port", str(worker_port),
        ],
        folder / "controller.log",
    )  # fmt: skip
    api = f"http://127.0.0.1:{api_port}"
    workers = [f"http://127.0.0.1:{worker_port + i}" for i in range(2)]
    trace = folder / "steady.csv"
    trace.write_text("timestamp,count\n" + "".join(f"{s},20\n" for s in range(200)))
    load = None
    try:
        ready = lambda: httpx.get(f"{api}/readyz").status_code == 200  # noqa: E731
        wait_for(ready, 90, "the controller", process=process, log=folder / "controller.log")
        load = subprocess.Popen(
            [
                sys.executable, "-m", "server.cli", "loadgen", "--trace", str(trace),
                "--target", ",".join(workers), "--duration", "150s", "--json",
            ],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(lambda: httpx.get(f"{api}/v1/pools/{POOL}").json()["last_decision"], 30, "a tick")
        yield api, workers, folder
    finally:
        if load is not None:
            stop(load)
        stop(process)


@pytest.fixture
def page(controller):
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.fail("chromium not found: apt-get install chromium (.ci/run installs it)")
    requested: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1400, "height": 1600})
        tab.on("request", lambda request: requested.append(request.url))
        problems: list[str] = []
        tab.on("pageerror", lambda error: problems.append(str(error)))
        tab.requested, tab.problems = requested, problems
        yield tab
        browser.close()
    # Every request stayed on this machine: no CDN, no fonts, no telemetry.
    assert requested and all(u.startswith(("http://127.0.0.1:", "data:")) for u in requested), {
        u for u in requested if not u.startswith("http://127.0.0.1:")
    }
    assert not problems, problems


# The Steer forms: each placeholder fits its input, each form's first field sits as high as
# the others', and no form has blank space below its last part (a form stretched to its row).
LAYOUT_PROBLEMS = """() => {
  const problems = [];
  const measure = document.createElement("canvas").getContext("2d");
  for (const input of document.querySelectorAll(".actions input[placeholder]")) {
    const style = getComputedStyle(input);
    measure.font = style.font;
    const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const needs = measure.measureText(input.placeholder).width;
    if (needs > room) problems.push(`${input.name}: placeholder ${needs} px in ${room} px`);
  }
  const forms = [...document.querySelectorAll(".actions form")];
  const firstField = forms.map((f) => f.querySelector("input").getBoundingClientRect().top
    - f.getBoundingClientRect().top);
  if (Math.max(...firstField) - Math.min(...firstField) > 1) {
    problems.push(`first fields at ${firstField} px`);
  }
  for (const form of forms) {
    const style = getComputedStyle(form);
    const blank = form.getBoundingClientRect().bottom - parseFloat(style.paddingBottom)
      - parseFloat(style.borderBottomWidth) - form.lastElementChild.getBoundingClientRect().bottom;
    if (blank > 1) problems.push(`${form.id}: ${blank} px blank below`);
  }
  return problems;
}"""


def fact(page, label: str) -> str:
    return page.inner_text(f'[data-fact="{label}"]')


def test_the_pool_page_shows_what_the_api_says(controller, page):
    api, _, folder = controller
    page.goto(f"{api}/ui#/pools/{POOL}")
    page.wait_for_selector("#workers tbody tr >> nth=1")
    page.wait_for_selector("#chart-load canvas")
    summary = httpx.get(f"{api}/v1/pools/{POOL}").json()
    config = summary["config"]
    shown = fact(page, "config in force")
    assert shown.startswith(f"batch {config['max_batch']}, {config['timeout_ms']:.1f} ms"), shown
    assert fact(page, "version") == str(summary["version"])
    assert fact(page, "workers alive") == "2"
    assert fact(page, "policy") == summary["policy"]
    names = page.locator("#workers tbody tr td:first-child").all_inner_texts()
    assert sorted(names) == ["local-0", "local-1"]
    assert page.locator("#decisions tbody tr").count() >= 1
    shown = page.eval_on_selector_all(
        "#decisions tbody tr", "rows => rows.map(r => r.dataset.time)"
    )
    times = [float(t) for t in shown]
    assert times == sorted(times, reverse=True), times  # the newest decision on top
    # Away from the pointer a legend shows each series' latest value, not uPlot's "--".
    legends = page.locator(".chart .u-legend").all_inner_texts()
    assert len(legends) >= 3 and not any("--" in text for text in legends), legends
    assert "arrivals" in legends[0] and "latest" in legends[0], legends
    layout = page.evaluate(LAYOUT_PROBLEMS)
    assert not layout, layout
    page.screenshot(path=str(folder / "pool.png"), full_page=True)
    page.goto(f"{api}/ui")
    page.wait_for_selector(f'#pools a[href="#/pools/{POOL}"]')
    page.screenshot(path=str(folder / "pools.png"))


def test_a_wrong_token_is_refused_readably_and_a_pin_reaches_the_workers(controller, page):
    api, workers, folder = controller
    page.goto(f"{api}/ui#/pools/{POOL}")
    page.wait_for_selector("#pin-form")
    page.fill("#token", "not-the-token")
    page.click("#token-form button")
    page.fill('#pin-form input[name="max_batch"]', "4")
    page.fill('#pin-form input[name="timeout_ms"]', "3")
    page.fill('#pin-form input[name="reason"]', "from the console")
    page.click('#pin-form button[type="submit"]')
    page.wait_for_selector("#message.error")
    assert page.inner_text("#message") == ("Refused: wrong bearer token (authorization) [HTTP 403]")
    assert httpx.get(f"{api}/v1/pools/{POOL}").json()["override"] is None
    page.fill("#token", TOKEN)
    page.click("#token-form button")
    page.click('#pin-form button[type="submit"]')
    page.wait_for_selector("#message.info")
    assert page.inner_text("#message").startswith("Pinned batch 4, 3.0 ms until")

    def workers_pinned():
        stats = [httpx.get(f"{w}/v1/stats").json()["config"] for w in workers]
        return all(s["max_batch"] == 4 and s["timeout_ms"] == 3 for s in stats)

    wait_for(workers_pinned, 10, "both workers running the pinned config")
    page.wait_for_function(
        "document.querySelector('#decisions tbody').innerText.includes('override')", timeout=10_000
    )
    assert fact(page, "mode") == "override"
    page.screenshot(path=str(folder / "pinned.png"), full_page=True)
    # The token went in a header, never in a URL, and is not on the page.
    assert all(TOKEN not in url for url in page.requested)
    assert TOKEN not in page.content()
    page.click("#unpin")
    page.wait_for_function("document.querySelector('#message').innerText === 'Pin lifted.'")
    assert httpx.get(f"{api}/v1/pools/{POOL}").json()["override"] is None


def test_events_are_declared_and_deleted_from_the_page(controller, page):
    api, _, _ = controller
    page.goto(f"{api}/ui#/pools/{POOL}")
    page.wait_for_selector("#event-form")
    page.fill("#token", TOKEN)
    page.click("#token-form button")
    page.fill('#event-form input[name="name"]', "flash-sale")
    page.fill('#event-form input[name="start"]', "2030-01-01T20:00")
    page.fill('#event-form input[name="end"]', "2030-01-01T21:00")
    page.fill('#event-form input[name="multiplier"]', "4")
    page.click('#event-form button[type="submit"]')
    page.wait_for_selector('[data-delete-event="flash-sale"]')
    (event,) = httpx.get(f"{api}/v1/pools/{POOL}/events").json()["events"]
    assert event["name"] == "flash-sale" and event["multiplier"] == 4
    assert event["end"] - event["start"] == 3600  # the page's local times, as Unix seconds
    page.click('[data-delete-event="flash-sale"]')
    page.wait_for_function("document.querySelector('#events').innerText.includes('No declared')")
    assert httpx.get(f"{api}/v1/pools/{POOL}/events").json()["events"] == []
