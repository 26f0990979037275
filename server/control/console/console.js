// Tidal's operator console: a pools page and a page per pool, drawn from the controller's
// own API (the same JSON curl sees) and refreshed by polling, one refresh at a time, and
// at once after each change made from the page. Charts are uPlot (vendored
// under vendor/uplot). The write token lives in this tab's sessionStorage and travels
// only in the Authorization header, never in a URL.
"use strict";

const PERIOD_MS = 2000;
const TOKEN_KEY = "tidal-api-token";
const $ = (selector, root = document) => root.querySelector(selector);
const view = $("#view");
let refresh = null; // the current page's refresh function
let charts = {};
let running = null; // the refresh in flight
let queued = null; // the one asked for while it runs

// -- the API -------------------------------------------------------------------------

class ApiError extends Error {}

async function api(path, { method = "GET", body } = {}) {
  const headers = { accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.authorization = `Bearer ${token}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const response = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { error: text }; }
  if (!response.ok) {
    const what = (data && (data.error || data.detail)) || response.statusText;
    const field = data && data.field ? ` (${data.field})` : "";
    const verb = response.status === 401 || response.status === 403 ? "Refused" : "Failed";
    throw new ApiError(`${verb}: ${what}${field} [HTTP ${response.status}]`);
  }
  return data;
}

function say(text, kind = "info") {
  const box = $("#message");
  box.textContent = text;
  box.className = kind;
  box.hidden = false;
  if (kind === "info") setTimeout(() => { if (box.textContent === text) box.hidden = true; }, 5000);
}

// One refresh at a time: on a slow machine the next poll never piles onto a refresh that
// is still waiting for the API, and a refresh asked for while one runs (after a change)
// starts when that one ends, so it reads the API after the change.
function reload() {
  if (!refresh) return Promise.resolve();
  if (running) {
    queued ??= running.catch(() => {}).then(() => { queued = null; return reload(); });
    return queued;
  }
  running = refresh().finally(() => { running = null; });
  return running;
}

async function act(work, done) {
  try {
    const result = await work();
    say(done(result), "info");
    await reload();
  } catch (error) {
    say(error.message, "error");
  }
}

// -- formatting ----------------------------------------------------------------------

const esc = (value) => String(value ?? "").replace(/[&<>"']/g,
  (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const num = (value, digits = 1) => (value === null || value === undefined ? "–" : Number(value).toFixed(digits));
const clock = (unix) => new Date(unix * 1000).toLocaleTimeString();
const config = (c) => (c ? `batch ${c.max_batch}, ${num(c.timeout_ms, 1)} ms` + (c.warm_max_batch > c.max_batch ? `, warm ${c.warm_max_batch}` : "") : "–");
const fact = (label, value, cls = "") => `<div class="fact"><div class="label">${esc(label)}</div><div class="value ${cls}" data-fact="${esc(label)}">${value}</div></div>`;

// -- the pools page ------------------------------------------------------------------

async function poolsPage() {
  $("#crumbs").innerHTML = "";
  view.innerHTML = `<h1>Pools</h1><table id="pools"><thead><tr><th>pool</th><th>policy</th>
    <th>mode</th><th>config in force</th><th class="num">version</th><th class="num">rate req/s</th>
    <th class="num">p99 ms</th><th class="num">SLO ms</th><th class="num">workers</th><th>ready</th></tr></thead><tbody></tbody></table>`;
  const page = refresh = async () => {
    const { pools } = await api("/v1/pools");
    if (refresh !== page) return; // the operator has moved on to another page
    $("#pools tbody").innerHTML = pools.map((p) => {
      const inputs = p.last_decision ? p.last_decision.inputs : {};
      return `<tr><td><a href="#/pools/${encodeURIComponent(p.pool)}">${esc(p.pool)}</a></td>
        <td>${esc(p.policy)}</td><td class="mode-${esc(p.mode)}">${esc(p.mode)}</td>
        <td>${esc(config(p.config))}</td><td class="num">${p.version}</td>
        <td class="num">${num(inputs.rate_rps)}</td><td class="num">${num(inputs.p99_ms)}</td>
        <td class="num">${num(p.slo_ms, 0)}</td><td class="num">${p.workers_alive}</td>
        <td>${p.ready ? "yes" : `<span class="bad">no</span>`}</td></tr>`;
    }).join("");
  };
  await reload();
}

// -- a pool's page -------------------------------------------------------------------

function poolSkeleton(pool) {
  $("#crumbs").innerHTML = `<a href="#/">pools</a> / ${esc(pool)}`;
  view.innerHTML = `
    <h1>Pool ${esc(pool)}</h1>
    <section class="facts" id="facts"></section>
    <h2>Load, config and latency</h2>
    <section class="charts">
      <div class="chart"><h3>Arrivals, forecast band ahead, declared events (req/s)</h3><div id="chart-load"></div></div>
      <div class="chart"><h3>Batch cap asked, served, kept warm; timeout</h3><div id="chart-config"></div></div>
      <div class="chart"><h3>p99 against the SLO (ms)</h3><div id="chart-p99"></div></div>
      <div class="chart" id="replicas-box" hidden><h3>Desired replicas</h3><div id="chart-replicas"></div></div>
    </section>
    <h2>Latest decisions</h2>
    <table id="decisions"><thead><tr><th>time</th><th>kind</th><th>chosen</th><th class="num">pred. p99 ms</th>
      <th>reason</th><th>alternatives</th></tr></thead><tbody></tbody></table>
    <h2>Workers</h2>
    <table id="workers"><thead><tr><th>worker</th><th class="num">heartbeat age s</th><th class="num">config version</th>
      <th>warmed sizes</th><th class="num">queue</th><th class="num">ingress p99 ms</th><th>engine</th></tr></thead><tbody></tbody></table>
    <h2>Steer</h2>
    <section class="actions">
      <form id="pin-form"><strong>Pin a config</strong>
        <label>max batch <input name="max_batch" type="number" min="1" value="32" required></label>
        <label>timeout ms <input name="timeout_ms" type="number" min="0" step="any" value="10" required></label>
        <label>warm max batch <input name="warm_max_batch" type="number" min="0" value="0"></label>
        <label>for <input name="duration" value="30m" required></label>
        <label>reason <input name="reason" placeholder="why, for the record"></label>
        <div><button type="submit">Pin</button> <button type="button" id="unpin">Lift the pin</button></div>
      </form>
      <form id="event-form"><strong>Declare an event</strong>
        <label>name <input name="name" required></label>
        <label>start <input name="start" type="datetime-local" required></label>
        <label>end <input name="end" type="datetime-local" required></label>
        <label>multiplier <input name="multiplier" type="number" step="any" min="0" value="3" required></label>
        <div><button type="submit">Declare</button></div>
        <div id="events"></div>
      </form>
      <form id="policy-form"><strong>Switch policy</strong>
        <label>policy <input name="policy" placeholder="predictive:forecaster=holt-winters" required></label>
        <div><button type="submit">Switch</button></div>
      </form>
      <form id="gate-form"><strong>Rollout gate</strong>
        <label>candidate <input name="candidate" placeholder="static:max_batch=32,timeout=10ms" required></label>
        <label>hours <input name="hours" type="number" min="0.02" step="any" value="1" required></label>
        <div><button type="submit">Simulate side by side</button></div>
        <div id="gate"></div>
      </form>
    </section>`;
}

async function poolPage(pool) {
  poolSkeleton(pool);
  const path = `/v1/pools/${encodeURIComponent(pool)}`;
  wireActions(pool, path);
  charts = {};
  const page = refresh = async () => {
    const [summary, timeline, forecast, decisions, workers, events] = await Promise.all([
      api(path), api(`${path}/timeline?seconds=21600&points=600`), api(`${path}/forecast`),
      api(`${path}/decisions?limit=20`), api(`${path}/workers`), api(`${path}/events`),
    ]);
    if (refresh !== page) return;
    drawFacts(summary);
    drawCharts(summary, timeline.columns, forecast, events.events);
    drawDecisions(decisions.decisions);
    drawWorkers(workers.workers, summary.version);
    drawEvents(events.events);
  };
  await reload();
}

function drawFacts(s) {
  const last = s.last_decision || {};
  const inputs = last.inputs || {};
  const mode = s.mode + (s.mode_reason ? `: ${s.mode_reason}` : "");
  const notReady = Object.entries(s.workers_not_ready || {}).map(([name, why]) => `${name}: ${why}`);
  const pinned = s.override ? `${config(s.override)} until ${clock(s.override.until)}` : "none";
  $("#facts").innerHTML = [
    fact("config in force", esc(config(s.config))),
    fact("version", s.version),
    fact("policy", esc(s.policy)),
    fact("mode", esc(mode), `mode-${esc(s.mode)}`),
    fact("override", esc(pinned)),
    fact("rate req/s", num(inputs.rate_rps)),
    fact("p99 ms", num(inputs.p99_ms)),
    fact("SLO ms", num(s.slo_ms, 0)),
    fact("SLO feasible", s.slo_feasible ? "yes" : `<span class="bad">no, for ${num(s.slo_infeasible_for_s, 0)} s</span>`),
    fact("workers alive", s.workers_alive),
    fact("workers ready", notReady.length ? `<span class="bad">${s.workers_ready} (${esc(notReady.join("; "))})</span>` : s.workers_ready),
    fact("desired replicas", s.desired_replicas ?? "fixed fleet"),
    fact("leader", esc(s.leader ?? "none")),
    fact("ready", s.ready ? "yes" : `<span class="bad">no: ${esc(s.last_error)}</span>`),
  ].join("");
}

// Charts: uPlot wants one x array for all series; timeline and forecast share Unix time.
function drawCharts(summary, cols, forecast, events) {
  const width = Math.max(560, $("#chart-load").clientWidth || 600);
  const ahead = (forecast.forecast && forecast.forecast.points) || [];
  const x = [...cols.time, ...ahead.map((p) => p.time).filter((t) => t > (cols.time.at(-1) ?? 0))];
  const pad = (values) => [...values, ...Array(x.length - values.length).fill(null)];
  const lead = (key) => [...Array(cols.time.length).fill(null), ...ahead.filter((p) => p.time > (cols.time.at(-1) ?? 0)).map((p) => p[key])];
  const eventBands = (u) => {
    const { ctx } = u;
    ctx.save();
    ctx.fillStyle = "rgba(234, 179, 8, 0.15)";
    for (const e of events) {
      const left = u.valToPos(Math.max(e.start, u.scales.x.min), "x", true);
      const right = u.valToPos(Math.min(e.end, u.scales.x.max), "x", true);
      if (right > left) ctx.fillRect(left, u.bbox.top, right - left, u.bbox.height);
    }
    ctx.restore();
  };
  plot("load", width, [x, pad(cols.rate_rps), lead("mean_rps"), lead("upper_rps"), lead("lower_rps")], {
    series: [{}, { label: "arrivals", stroke: "#0f172a" },
      { label: "forecast", stroke: "#2563eb", dash: [6, 4], ahead: true },
      { label: "band high", stroke: "#93c5fd", ahead: true }, { label: "band low", stroke: "#93c5fd", ahead: true }],
    bands: [{ series: [3, 4], fill: "rgba(147, 197, 253, 0.3)" }],
    hooks: { drawClear: [eventBands] },
  });
  const stepped = uPlot.paths.stepped({ align: 1 });
  plot("config", width, [cols.time, cols.max_batch, cols.serving_max_batch, cols.warm_max_batch, cols.timeout_ms], {
    series: [{}, { label: "cap asked", stroke: "#2563eb", paths: stepped, digits: 0 },
      { label: "cap served", stroke: "#16a34a", paths: stepped, dash: [4, 3], digits: 0 },
      { label: "kept warm", stroke: "#f59e0b", paths: stepped, digits: 0 },
      { label: "timeout ms", stroke: "#9333ea", paths: stepped, scale: "ms" }],
    axes: [{}, { label: "batch" }, { side: 1, scale: "ms", label: "timeout ms", grid: { show: false } }],
  });
  plot("p99", width, [cols.time, cols.p99_ms, cols.time.map(() => summary.slo_ms)], {
    series: [{}, { label: "p99", stroke: "#0f172a" }, { label: `SLO ${num(summary.slo_ms, 0)} ms`, stroke: "#dc2626", dash: [6, 4] }],
  });
  const scales = cols.replicas.some((r) => r !== null);
  $("#replicas-box").hidden = !scales;
  if (scales) plot("replicas", width, [cols.time, cols.replicas], { series: [{}, { label: "desired", stroke: "#0f172a", paths: stepped, digits: 0 }] });
}

// Legends: the values under the pointer; away from the chart, each series' latest value
// (a forecast's: its next one ahead), never uPlot's "--" placeholder.
function withLegend(series) {
  const pick = (values, ahead) => {
    const seen = values.filter((v) => v !== null && v !== undefined);
    return ahead ? seen[0] : seen.at(-1);
  };
  return series.map((s, i) => (i === 0
    ? { label: "time", ...s, value: (u, v, _i, idx) => (idx == null ? "latest" : new Date(v * 1000).toLocaleTimeString()) }
    : { ...s, value: (u, v, sidx, idx) => num(idx == null ? pick(u.data[sidx], s.ahead) : v, s.digits ?? 1) }));
}

function plot(name, width, data, options) {
  if (charts[name]) { charts[name].setData(data); return; }
  const opts = { width, height: 220, scales: { x: { time: true } }, ...options, series: withLegend(options.series) };
  charts[name] = new uPlot(opts, data, $(`#chart-${name}`));
}

function drawDecisions(records) {
  // The API lists the newest `limit` oldest first; the page puts the newest on top.
  $("#decisions tbody").innerHTML = [...records].reverse().map((d) => {
    const weighed = (d.alternatives || []).map((a) => `<li>batch ${a.max_batch}, ${a.timeout_ms} ms: p99 ${num(a.predicted_p99_ms)} ms, busy ${num(a.busy_ms_per_request, 3)} ms/req</li>`).join("");
    const why = [d.reason, d.guard, d.replanned].filter(Boolean).map(esc).join("<br>");
    return `<tr data-time="${d.time}"><td>${clock(d.time)}</td><td>${esc(d.kind)}</td><td>${esc(config(d.chosen))}</td>
      <td class="num">${num(d.predicted_p99_ms)}</td><td class="reason">${why}</td>
      <td>${weighed ? `<details><summary>${d.alternatives.length} weighed</summary><ul>${weighed}</ul></details>` : "–"}</td></tr>`;
  }).join("");
}

function drawWorkers(workers, version) {
  $("#workers tbody").innerHTML = workers.map((w) => {
    const stats = w.last_stats || {};
    const diverged = Number(w.config_version) !== Number(version);
    const warmed = stats.warmed_buckets ?? w.warmed_buckets;
    return `<tr><td>${esc(w.name)}</td><td class="num">${num(w.heartbeat_age_s)}</td>
      <td class="num ${diverged ? "bad" : ""}" title="${diverged ? `the pool runs v${version}` : ""}">${esc(w.config_version)}${diverged ? " (diverged)" : ""}</td>
      <td>${warmed ? esc(warmed.join(", ")) : "–"}</td><td class="num">${stats.queue_depth ?? "–"}</td>
      <td class="num">${num(stats.ingress_p99_ms)}</td><td>${esc(w.engine ?? "tidal-worker")}</td></tr>`;
  }).join("");
}

function drawEvents(events) {
  $("#events").innerHTML = events.length ? `<ul>${events.map((e) => `<li>${esc(e.name)}: ${clock(e.start)} to ${clock(e.end)}
    ${e.multiplier ? `x${e.multiplier}` : `${e.rate_rps} req/s`} <button type="button" data-delete-event="${esc(e.name)}">delete</button></li>`).join("")}</ul>` : "<p>No declared events.</p>";
}

function wireActions(pool, path) {
  const values = (form) => Object.fromEntries(new FormData(form).entries());
  $("#pin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const v = values(event.target);
    const body = { max_batch: Number(v.max_batch), timeout_ms: Number(v.timeout_ms),
      warm_max_batch: Number(v.warm_max_batch || 0), duration: v.duration, reason: v.reason };
    act(() => api(`${path}/override`, { method: "PUT", body }), (r) => `Pinned ${config(r.override)} until ${clock(r.override.until)}.`);
  });
  $("#unpin").addEventListener("click", () =>
    act(() => api(`${path}/override`, { method: "DELETE" }), (r) => (r.lifted ? "Pin lifted." : "There was no pin.")));
  $("#event-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const v = values(event.target);
    const unix = (local) => new Date(local).getTime() / 1000;
    const body = { events: [{ name: v.name, start: unix(v.start), end: unix(v.end), multiplier: Number(v.multiplier) }] };
    act(() => api(`${path}/events`, { method: "POST", body }), () => `Declared ${v.name}.`);
  });
  $("#events").addEventListener("click", (event) => {
    const name = event.target.dataset.deleteEvent;
    if (name) act(() => api(`${path}/events?name=${encodeURIComponent(name)}`, { method: "DELETE" }), () => `Deleted ${name}.`);
  });
  $("#policy-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const { policy } = values(event.target);
    act(() => api(`${path}/policy`, { method: "PUT", body: { policy } }), (r) => `Policy is now ${r.policy}.`);
  });
  $("#gate-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const { candidate, hours } = values(event.target);
    act(async () => {
      const result = await api(`${path}/simulate`, { method: "POST", body: { candidate, hours: Number(hours) } });
      drawGate(path, candidate, Number(hours), result);
      return result;
    }, (r) => `Simulated ${r.traffic.seconds} s of recorded traffic: the candidate is ${r.no_worse_on_slo ? "no worse" : "worse"} on the SLO.`);
  });
}

function drawGate(path, candidate, hours, r) {
  const rows = [["SLO attainment %", (s) => num(s.slo_attainment * 100, 3)], ["p50 ms", (s) => num(s.latency_ms.p50)],
    ["p99 ms", (s) => num(s.latency_ms.p99)], ["busy s per 1k", (s) => num(s.busy_seconds_per_1k, 3)],
    ["mean batch", (s) => num(s.mean_batch_size, 2)], ["config changes", (s) => s.config_changes]];
  // One table, the two policies side by side (their specs below it: a spec can be long).
  $("#gate").innerHTML = `<table class="side-by-side"><thead><tr><th></th><th class="num">current</th><th class="num">candidate</th></tr></thead>
    <tbody>${rows.map(([label, f]) => `<tr><td>${label}</td><td class="num">${f(r.current)}</td><td class="num">${f(r.candidate)}</td></tr>`).join("")}</tbody></table>
    <p class="specs">current: <code>${esc(r.current.policy)}</code><br>candidate: <code>${esc(r.candidate.policy)}</code></p>
    <p>On ${r.traffic.seconds} s of recorded traffic, ${r.latency_model ? `latency model ${esc(r.latency_model)}` : ""}.</p>
    ${r.no_worse_on_slo ? `<button type="button" id="promote">Promote the candidate</button>` : "<p class=\"bad\">Worse on the SLO: not promotable.</p>"}`;
  const promote = $("#promote");
  if (promote) promote.addEventListener("click", () => act(
    () => api(`${path}/simulate`, { method: "POST", body: { candidate, hours, promote: true } }),
    (result) => (result.promoted ? `Promoted: the policy is now ${candidate}.` : "Not promoted: it was worse on a rerun.")));
}

// -- routing and the token -------------------------------------------------------------

async function route() {
  const match = location.hash.match(/^#\/pools\/(.+)$/);
  try {
    if (match) await poolPage(decodeURIComponent(match[1]));
    else await poolsPage();
  } catch (error) {
    say(error.message, "error");
  }
}

$("#token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const token = $("#token").value;
  if (token) sessionStorage.setItem(TOKEN_KEY, token); else sessionStorage.removeItem(TOKEN_KEY);
  $("#token").value = "";
  showTokenState();
});

function showTokenState() {
  $("#token-state").textContent = sessionStorage.getItem(TOKEN_KEY) ? "token set for this tab" : "read-only";
}

$("#period").textContent = PERIOD_MS / 1000;
window.addEventListener("hashchange", route);
// The next poll is due PERIOD_MS after the last one ended (not started): a refresh slower
// than the period delays the next one instead of running beside it.
async function poll() {
  if (refresh && !document.hidden) {
    try { await reload(); } catch (error) { say(error.message, "error"); }
  }
  setTimeout(poll, PERIOD_MS);
}
document.addEventListener("visibilitychange", () => { if (!document.hidden) reload().catch(() => {}); });
showTokenState();
route().then(() => setTimeout(poll, PERIOD_MS));
