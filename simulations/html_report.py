"""`report.html`: one self-contained page of a simulation run, tables and plots.

Everything is inside the file (the plots as PNG data URIs, the style inline), so it opens
offline, in a mail attachment or a CI artifact, as it was written.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from simulations.report import summary_dict
from simulations.run import SimulationReport

_POLICY_COLUMNS = (
    ("policy", lambda p: p["policy"], "text",
     "The policy as run, with its defaults filled in."),
    ("p50 ms", lambda p: p["latency_ms"]["p50"], "num",
     "Median latency of the completed requests: arrival at the batcher to the end of its "
     "batch (queue wait plus execution). Shed requests are not in it."),
    ("p99 ms", lambda p: p["latency_ms"]["p99"], "num",
     "99th percentile of the same latencies, over the whole run: the SLO's quantile."),
    ("p99.9 ms", lambda p: p["latency_ms"]["p999"], "num",
     "99.9th percentile of the same latencies. The quantiles come from a log-bucketed "
     "histogram with at most 1% relative error."),
    ("SLO %", lambda p: 100 * p["slo_attainment"], "pct",
     "Requests completed within the SLO, over all requests offered (shed ones count as "
     "missed)."),
    ("worst 10 min %", lambda p: 100 * p["slo_attainment_worst_10min"], "pct",
     "The lowest SLO attainment over any 10 minutes of consecutive timeline windows: how "
     "bad the worst stretch was (worst10m in the terminal table)."),
    ("shed", lambda p: p["shed"], "int",
     "Requests dropped, never served: over --max-queue, or past the simulator's safety "
     "limit on the queue (a note says so)."),
    ("mean batch", lambda p: p["mean_batch_size"], "num",
     "Requests per batch, averaged over batches (batch in the terminal table)."),
    ("fill", lambda p: p["batch_fill_ratio"], "ratio",
     "Batch size over the cap it ran under, averaged over batches: 1 means every batch "
     "was full, low means batches left on their timeout."),
    ("util", lambda p: p["utilization"], "ratio",
     "Worker utilisation: busy time over the replica time paid for (workers times the "
     "run's span on a fixed fleet)."),
    ("busy s / 1k", lambda p: p["busy_seconds_per_1k"], "ratio",
     "GPU busy seconds per 1,000 completed requests: the cost of serving; bigger batches "
     "cost less per request (busy/1k in the terminal table)."),
    ("config changes", lambda p: p["config_changes"], "int",
     "Batch configs the controller published (changes in the terminal table); a static "
     "policy has none."),
    ("fallback s", lambda p: p["fallback_s"], "int",
     "Seconds the controller spent in fallback, reactive deciding because the forecast "
     "was missing or had left its band (fallbk s in the terminal table); only the "
     "forecasting policies have any."),
)  # fmt: skip
"""(header, value from the summary entry, format, definition), as the terminal table."""

_SCALING_COLUMNS = (
    ("replica-h", lambda p: p["replica_seconds"] / 3600, "num",
     "Replica-hours paid for: every replica from the moment it was asked for, starting "
     "or ready (rep-h in the terminal table)."),
    ("max replicas", lambda p: p["max_replicas"], "int",
     "The most replicas provisioned at once (max rep)."),
    ("replica changes", lambda p: p["replica_changes"], "int",
     "How often the replica count changed (scaled)."),
)  # fmt: skip
"""Only where the fleet's size was the policies' to change (--max-replicas)."""

_CAPTIONS = {
    "arrival_rate": "Arrivals per window over the run; declared events shaded.",
    "p99": "p99 per window, one panel per policy, the other policies in grey behind it, "
    "on one scale, against the SLO.",
    "batching": "Mean batch size and worker utilisation per window, one row per policy, "
    "the other policies in grey behind it.",
    "control": "One row per policy: load with the forecast band, the batch cap asked "
    "(line) and served (filled) with the timeout (dashed, right axis), and p99 vs the "
    "SLO. Each column has one scale. Shown at its native width: on a narrower window, "
    "scroll sideways.",
}

_STYLE = """
/* No max-width: the plots are wider than a text column (control.png is 2,090 px). */
body { font: 14px/1.45 system-ui, sans-serif; color: #1d2330; margin: 1.5rem 1rem; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 1.6rem; }
table { border-collapse: collapse; }
th, td { padding: .3rem .6rem; border-bottom: 1px solid #e5e7eb; }
th { text-align: left; color: #6b7280; font-size: 12px; }
th[title] { cursor: help; text-decoration: underline dotted; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; }
dt { color: #6b7280; }
dl.columns { max-width: 60rem; font-size: 13px; }
dl.columns dt { font-weight: 600; color: #1d2330; white-space: nowrap; }
dl.columns dd { margin: 0; }
figure { margin: .4rem 0 1rem; }
figcaption { color: #6b7280; font-size: 13px; margin-bottom: .3rem; max-width: 60rem; }
/* A plot keeps its native width (its text is sized for it); on a narrower window it
   scrolls sideways in its box rather than shrinking. */
.plot { overflow-x: auto; width: fit-content; max-width: 100%; border: 1px solid #e5e7eb; }
.plot img { display: block; max-width: none; }
"""


def write_html_report(report: SimulationReport, out_dir: Path, plots: list[Path]) -> Path:
    """`out_dir/report.html` from the run and the PNGs already written; returns its path."""
    summary = summary_dict(report)
    path = out_dir / "report.html"
    path.write_text(_page(report, summary, plots), encoding="utf-8")
    return path


def _columns(report: SimulationReport) -> tuple:
    return _POLICY_COLUMNS + (_SCALING_COLUMNS if report.scaling else ())


def _page(report: SimulationReport, summary: dict, plots: list[Path]) -> str:
    facts = {
        "trace": report.trace,
        "requests": f"{report.requests:,}",
        "workers": report.workers,
        "SLO": f"{report.slo_s * 1e3:g} ms (p99)",
        "latency model": report.latency_model,
        "control tick / window": f"{report.tick_s:g} s / {report.window_s:g} s",
        "declared events": ", ".join(e.name for e in report.events) or "none",
    }
    columns = _columns(report)
    rows = "".join(
        "<tr>" + "".join(_cell(get(p), kind) for _, get, kind, _ in columns) + "</tr>"
        for p in summary["policies"]
    )
    header = "".join(
        f'<th title="{html.escape(meaning)}">{html.escape(name)}</th>'
        for name, _, _, meaning in columns
    )
    meanings = "".join(
        f"<dt>{html.escape(name)}</dt><dd>{html.escape(meaning)}</dd>"
        for name, _, _, meaning in columns
    )
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    images = "".join(_figure(p) for p in plots)
    title = html.escape(report.trace)
    listed = "".join(
        f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in facts.items()
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Tidal simulation: {title}</title>
<style>{_STYLE}</style></head><body>
<h1>Simulation of {title}</h1>
<dl>{listed}</dl>
<h2>Policies</h2><table><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table>
<h2>Columns</h2><dl class="columns">{meanings}</dl>
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
{images}
</body></html>
"""


def _figure(path: Path) -> str:
    """A plot inline at its native size, in a box that scrolls where the page is narrower."""
    data = path.read_bytes()
    width, height = _png_size(data)
    caption = _CAPTIONS.get(path.stem, "")
    return (
        f"<h2>{html.escape(path.stem.replace('_', ' '))}</h2><figure>"
        + (f"<figcaption>{html.escape(caption)}</figcaption>" if caption else "")
        + f'<div class="plot"><img alt="{html.escape(path.stem)}" width="{width}" '
        f'height="{height}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
        "</div></figure>"
    )


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, which the format puts first."""
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _cell(value, kind: str) -> str:
    if kind == "text":
        return f"<td>{html.escape(str(value))}</td>"
    if value is None:
        return '<td class="num">-</td>'
    text = {
        "num": f"{value:,.2f}",
        "pct": f"{value:.2f}",
        "int": f"{value:,.0f}",
        "ratio": f"{value:.3f}",
    }[kind]
    return f'<td class="num">{text}</td>'
