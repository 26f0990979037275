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

_COLUMNS = (
    ("policy", lambda p: p["policy"], "text"),
    ("p50 ms", lambda p: p["latency_ms"]["p50"], "num"),
    ("p99 ms", lambda p: p["latency_ms"]["p99"], "num"),
    ("p99.9 ms", lambda p: p["latency_ms"]["p999"], "num"),
    ("SLO %", lambda p: 100 * p["slo_attainment"], "pct"),
    ("worst 10 min %", lambda p: 100 * p["slo_attainment_worst_10min"], "pct"),
    ("shed", lambda p: p["shed"], "int"),
    ("mean batch", lambda p: p["mean_batch_size"], "num"),
    ("fill", lambda p: p["batch_fill_ratio"], "ratio"),
    ("busy s / 1k", lambda p: p["busy_seconds_per_1k"], "ratio"),
    ("config changes", lambda p: p["config_changes"], "int"),
    ("fallback s", lambda p: p["fallback_s"], "int"),
)

_STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #1d2330; margin: 1.5rem auto;
       max-width: 1500px; padding: 0 1rem; }
h1 { font-size: 1.4rem; } h2 { font-size: 1.1rem; margin-top: 1.6rem; }
table { border-collapse: collapse; }
th, td { padding: .3rem .6rem; border-bottom: 1px solid #e5e7eb; }
th { text-align: left; color: #6b7280; font-size: 12px; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
dl { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1rem; }
dt { color: #6b7280; }
img { max-width: 100%; border: 1px solid #e5e7eb; margin: .4rem 0; }
"""


def write_html_report(report: SimulationReport, out_dir: Path, plots: list[Path]) -> Path:
    """`out_dir/report.html` from the run and the PNGs already written; returns its path."""
    summary = summary_dict(report)
    path = out_dir / "report.html"
    path.write_text(_page(report, summary, plots), encoding="utf-8")
    return path


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
    rows = "".join(
        "<tr>" + "".join(_cell(get(p), kind) for _, get, kind in _COLUMNS) + "</tr>"
        for p in summary["policies"]
    )
    header = "".join(f"<th>{html.escape(name)}</th>" for name, _, _ in _COLUMNS)
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.notes)
    images = "".join(
        f'<h2>{html.escape(p.stem.replace("_", " "))}</h2><img alt="{html.escape(p.stem)}" '
        f'src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}">'
        for p in plots
    )
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
{f"<h2>Notes</h2><ul>{notes}</ul>" if notes else ""}
{images}
</body></html>
"""


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
