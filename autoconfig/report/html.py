"""A self-contained, offline HTML report of a search: inputs, the top-k table, a scatter of all
feasible candidates, stacked memory and step-time breakdowns, and the model's known accuracy.
plotly's JavaScript is embedded once, so the page makes no network requests."""

from __future__ import annotations

import html
import json

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from autoconfig import layout, resources
from autoconfig.measure.result import MeasuredSearch
from autoconfig.report.terminal import MEMORY_PARTS, TIME_PARTS
from autoconfig.training.rank import top_row
from autoconfig.training.result import SearchResult

ACCURACY = "accuracy.json"  # written by scripts/validate_published.py
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; }
th:nth-child(2), td:nth-child(2) { text-align: left; }
.note { color: #555; font-size: 0.9rem; max-width: 60rem; }
"""


def _accuracy_note() -> str:
    asset = resources.asset(ACCURACY)
    if not asset.is_file():
        return "The model's accuracy has not been measured for this installation."
    acc = json.loads(asset.read_text())
    return (
        f"Known accuracy (docs/validation.md, {acc['rows']} published runs, 16-bit, held-out "
        f"rows included): median absolute error of tokens/s/GPU {acc['median_ape_pct']:.0f}%, "
        f"{acc['within_20_pct']:.0f}% of runs within ±20%; outside the nanotron sweep "
        f"{acc['median_ape_other_pct']:.0f}%. Configurations within 10% of the best are near-ties."
    )


def _table(table_id: str, head: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table id='{table_id}'><tr>{cells}</tr>{body}</table>"


def _top_table(top: pd.DataFrame) -> str:
    rows = [top_row(r) for _, r in top.iterrows()]
    head = list(rows[0]) if rows else []
    return _table("top", head, [list(r.values()) for r in rows])


def _scatter(feasible: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    family = "tp" + feasible["tp"].astype(str) + " pp" + feasible["pp"].astype(str)
    for name, group in feasible.groupby(family, sort=True):
        fig.add_trace(
            go.Scattergl(
                x=group["pred_peak_mem_gb"],
                y=group["pred_tokens_per_s_per_gpu"],
                mode="markers",
                name=name,
                marker={"size": 5, "opacity": 0.6},
                text=layout.labels(group),
                hovertemplate="%{text}<br>%{x:.1f} GiB<br>%{y:,.0f} tokens/s/GPU<extra></extra>",
            )
        )
    fig.update_layout(
        title="Feasible candidates: memory vs predicted throughput",
        xaxis_title="peak memory per GPU (GiB)",
        yaxis_title="tokens/s/GPU",
        height=520,
    )
    return fig


def _stacked(top: pd.DataFrame, parts: tuple, title: str, unit: str) -> go.Figure:
    labels = "#" + top["rank"].astype(str) + " " + layout.labels(top)
    fig = go.Figure()
    for label, col in parts:
        fig.add_trace(go.Bar(name=label, x=labels, y=top[col]))
    fig.update_layout(barmode="stack", title=title, yaxis_title=unit, height=460)
    return fig


def _measured_section(search: MeasuredSearch) -> tuple[str, list[go.Figure]]:
    """The measured search: its ranking table and predicted vs measured throughput."""
    measured = search.ranking
    done = measured[measured["ranked_by"] == "measured"]
    tried = measured[measured["class"] != ""]
    rows = pd.concat([tried, measured[measured["class"] == ""].head(5)])
    cells = []
    for _, r in rows.iterrows():
        m = r["measured_tokens_per_s_per_gpu"]
        cells.append(
            [
                str(r["rank"]),
                r["label"],
                r["ranked_by"],
                "-" if pd.isna(m) else f"{m:,.0f}",
                f"{r['pred_tokens_per_s_per_gpu']:,.0f}",
                "-" if pd.isna(r["error_pct"]) else f"{r['error_pct']:+.0f}%",
                r["reason"],
            ]
        )
    head = ["#", "layout", "ranked by", "measured tokens/s/GPU", "predicted", "error", "reason"]
    table = _table("measured", head, cells)
    text = (
        "<h2>Measured trials</h2><p class='note'>Ranked by measured throughput where measured, "
        f"by the prediction otherwise (scaled by {search.scale:.3g}, the "
        "median measured/predicted ratio). Failed trials are listed with their class and "
        "reason.</p>" + table
    )
    if search.diagnosis():  # nothing succeeded: say why, by class, and what came closest
        lines = "<br>".join(html.escape(line.strip()) for line in search.diagnosis())
        text += f"<p class='note'><b>{lines}</b></p>"
    fig = go.Figure()
    if len(done):
        fig.add_trace(
            go.Scatter(
                x=done["pred_tokens_per_s_per_gpu"],
                y=done["measured_tokens_per_s_per_gpu"],
                mode="markers",
                text=done["label"],
                hovertemplate="%{text}<br>predicted %{x:,.0f}<br>measured %{y:,.0f}<extra></extra>",
            )
        )
        top = float(
            max(
                done["pred_tokens_per_s_per_gpu"].max(), done["measured_tokens_per_s_per_gpu"].max()
            )
        )
        fig.add_trace(go.Scatter(x=[0, top], y=[0, top], mode="lines", name="measured = predicted"))
    fig.update_layout(
        title="Predicted vs measured tokens/s/GPU",
        xaxis_title="predicted",
        yaxis_title="measured",
        height=460,
    )
    return text, [fig]


def render(result: SearchResult, top_k: int = 10, measured: MeasuredSearch | None = None) -> str:
    a = result.context()
    feasible = result.ranked
    top = feasible.head(top_k)
    inputs = {
        "model": a["model"],
        "GPUs": f"{a['gpus']} x {a['gpu']}",
        "sequence length": a["seq_len"],
        "global batch": f"{a['gbs']}" + (" (chosen by autoconfig)" if a["gbs_chosen"] else ""),
        "precision": a["precision"],
        "enumerated": f"{a['enumerated']:,}",
        "evaluated": f"{a['evaluated']:,}",
        "feasible": f"{a['feasible']:,}",
    }
    parts = [
        f"<h1>autoconfig: {html.escape(a['model'])} on {a['gpus']} GPUs</h1>",
        "<table id='inputs'>"
        + "".join(f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in inputs.items())
        + "</table>",
        f"<p class='note'>{html.escape(_accuracy_note())}</p>",
    ]
    if result.explanation:
        parts.append(f"<p>{html.escape(result.explanation)}</p>")
    for line in result.advice:
        parts.append(f"<p>{html.escape(line)}</p>")
    figures = []
    if len(feasible):
        parts.append("<h2>Top configurations</h2>" + _top_table(top))
        figures = [
            _scatter(feasible),
            _stacked(top, tuple((lbl, c) for lbl, c in MEMORY_PARTS), "Memory per GPU", "GiB"),
            _stacked(top, tuple((lbl, c) for lbl, c in TIME_PARTS), "Step time", "seconds"),
        ]
    if measured is not None:
        text, extra = _measured_section(measured)
        parts.append(text)
        figures = extra + figures
    for i, fig in enumerate(figures):
        parts.append(
            pio.to_html(fig, include_plotlyjs=(i == 0), full_html=False, div_id=f"plot{i}")
        )
    body = "\n".join(parts)
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>autoconfig "
        f"{html.escape(a['model'])}</title><style>{STYLE}</style></head><body>{body}"
        f"</body></html>"
    )
