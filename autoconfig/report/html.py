"""A self-contained, offline HTML report of a search: inputs, the top-k table (with days, GPU-hours
and cost when asked), a scatter of the feasible candidates (points that would overlap thinned),
stacked memory and step-time breakdowns, and the model's known accuracy. plotly.js's basic
bundle (scatter and bar traces, a quarter of the full library's size) is embedded once, so the
page makes no network requests and stays small."""

from __future__ import annotations

import html
import json

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio

from autoconfig.base import resources
from autoconfig.layout_search.rank import (
    EQUAL_SPEED,
    MEMORY_RISK_RULE,
    NEAR_TIE,
    NEAR_TIE_SOURCE,
    SPREAD,
    TIE_RULES,
    top_row,
)
from autoconfig.layout_search.result import SearchResult
from autoconfig.measure.result import MeasuredSearch
from autoconfig.report.terminal import (
    MEASURED_HEAD,
    MEMORY_PARTS,
    TIME_PARTS,
    answer_cells,
    failure_lines,
    measured_rows,
)
from autoconfig.spec import layout

ACCURACY = "accuracy.json"  # written by scripts/validate_published.py
# plotly.js's basic partial bundle, the same version as the plotly package's full one (MIT,
# npm plotly.js-basic-dist-min); the report uses only scatter and bar traces.
PLOTLY_JS = "plotly-basic.min.js"
THIN_GRID = 300  # the scatter keeps one point per family in each cell of a 300 x 300 grid
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; }
th:nth-child(2), td:nth-child(2) { text-align: left; }
.note { color: #555; font-size: 0.9rem; max-width: 60rem; }
"""


def inline_plotly() -> str:
    """The packaged plotly bundle as the text of an inline <script>, so a page draws offline
    (a "</script" inside it would end the element early)."""
    return resources.asset(PLOTLY_JS).read_text(encoding="utf-8").replace("</script", "<\\/script")


def _accuracy_note() -> str:
    asset = resources.asset(ACCURACY)
    if not asset.is_file():
        return "The model's accuracy has not been measured for this installation."
    return training_accuracy_note(json.loads(asset.read_text()))


def training_accuracy_note(acc: dict[str, float]) -> str:
    """What the validation measured (`acc`, the packaged accuracy.json): the median over the
    published source groups of each one's median error, on the fit's held-out rows too; the
    same with each group predicted by constants fitted without it, shown only while it was
    measured beside the current figures; then the pooled 16-bit runs. A figure the asset
    lacks is left out."""
    parts = []
    if "median_over_groups_pct" in acc:
        groups = acc.get("source_groups")
        over = f"over {groups} published source groups" if groups else "over the source groups"
        held = acc.get("held_out_median_over_groups_pct")
        in_sample = (
            f"the median of each group's median absolute error of tokens/s/GPU is "
            f"{acc['median_over_groups_pct']:.1f}% in sample, on the stacks and clusters the "
            "fit saw"
            + (f" ({held:.1f}% on its rows the fit did not see)" if held is not None else "")
        )
        fresh = acc.get("left_out_beside_median_over_groups_pct") == acc["median_over_groups_pct"]
        if "left_out_median_over_groups_pct" in acc and fresh:
            # Out of sample leads: what a user on a stack or cluster unlike the sources gets.
            parts.append(
                f"Known accuracy (docs/validation_left_out.md): {over}, each predicted by "
                f"constants fitted without it, a typical group's median error is "
                f"{acc['left_out_median_over_groups_pct']:.1f}%, and half the groups fare "
                f"worse: expect that on a stack or cluster unlike those sources. Beside it, "
                f"{in_sample} (docs/validation.md)."
            )
        else:
            parts.append(f"Known accuracy (docs/validation.md): {over}, {in_sample}.")
    lead = "" if parts else "Known accuracy (docs/validation.md): "
    parts.append(
        f"{lead}Over {acc['rows']} published 16-bit runs, the fit's own rows included: median "
        f"absolute error {acc['median_ape_pct']:.0f}%, {acc['within_20_pct']:.0f}% within "
        f"±20%; outside the nanotron sweep (whose own repeats disagree by more than 1.5x) "
        f"{acc['median_ape_other_pct']:.0f}%, pooled over rows (docs/validation.md says "
        "which sources they come from)."
    )
    parts.append(
        f"Layouts are ranked by the low end of their tokens/s/GPU spread: {SPREAD.source}. "
        f"Configurations within {100 * NEAR_TIE:g}% of the best are near-ties: "
        f"{NEAR_TIE_SOURCE}; among them a layout without memory risk is listed first "
        f"({MEMORY_RISK_RULE}; memory risk: {SPREAD.memory_source}). "
        f"Layouts within {100 * EQUAL_SPEED:g}% of each other run at "
        f"equal speed and are ordered by: "
        f"{', '.join(name for name, _ in TIE_RULES)}."
    )
    return " ".join(parts)


def _table(table_id: str, head: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table id='{table_id}'><tr>{cells}</tr>{body}</table>"


def _top_table(top: pd.DataFrame) -> str:
    rows = [top_row(r) | answer_cells(r) for _, r in top.iterrows()]
    head = list(rows[0]) if rows else []
    return _table("top", head, [list(r.values()) for r in rows])


def thin(points: pd.DataFrame, x: str, y: str, grid: int = THIN_GRID) -> pd.DataFrame:
    """One point (the fastest) per cell of a grid x grid raster of the plot: the points dropped
    would be drawn on top of a kept one."""
    if len(points) <= grid:
        return points
    span = lambda c: (points[c] - points[c].min()) / max(points[c].max() - points[c].min(), 1e-12)  # noqa: E731
    cell = (span(x) * (grid - 1)).round().astype(int) * grid + (span(y) * (grid - 1)).round()
    keep = points.assign(_cell=cell.astype(int)).sort_values(y, ascending=False)
    return points.loc[keep.drop_duplicates("_cell").index].sort_index()


def _scatter(feasible: pd.DataFrame) -> go.Figure:
    fig = go.Figure()
    family = "tp" + feasible["tp"].astype(str) + " pp" + feasible["pp"].astype(str)
    shown = 0
    for name, group in feasible.groupby(family, sort=True):
        group = thin(group, "pred_peak_mem_gib", "pred_tokens_per_s_per_gpu")
        shown += len(group)
        fig.add_trace(
            go.Scatter(
                x=group["pred_peak_mem_gib"].round(2),
                y=group["pred_tokens_per_s_per_gpu"].round(1),
                mode="markers",
                name=name,
                marker={"size": 5, "opacity": 0.6},
                text=layout.labels(group),
                hovertemplate="%{text}<br>%{x:.1f} GiB<br>%{y:,.0f} tokens/s/GPU<extra></extra>",
            )
        )
    thinned = f" ({shown:,} of {len(feasible):,} shown: overlapping points thinned)"
    fig.update_layout(
        title="Feasible candidates: memory vs predicted throughput"
        + (thinned if shown < len(feasible) else ""),
        xaxis_title="peak memory per GPU (GiB)",
        yaxis_title="tokens/s/GPU",
        legend_title_text="tp, pp",
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


def _relative_steps(top: pd.DataFrame, parts: tuple) -> go.Figure:
    """Each step-time part of the top layouts minus #1's, side by side: what each layout pays
    (above 0) or saves (below 0) against #1, so differences of a few percent are visible."""
    labels = "#" + top["rank"].astype(str) + " " + layout.labels(top)
    first = top.iloc[0]
    fig = go.Figure()
    for label, col in parts:
        delta = (top[col] - first[col]) * 1000
        if (delta.abs() < 1e-6).all():
            continue
        fig.add_trace(go.Bar(name=label, x=labels, y=delta.round(3)))
    total = (top["pred_step_time_s"] - first["pred_step_time_s"]) * 1000
    fig.add_trace(
        go.Scatter(
            name="step time vs #1",
            x=labels,
            y=total.round(3),
            mode="markers",
            marker={"symbol": "diamond", "size": 10, "color": "black"},
        )
    )
    fig.update_layout(
        barmode="relative",
        title=f"Step time against #1 ({first['pred_step_time_s']:.3f} s): each part's difference",
        yaxis_title="milliseconds more (+) or less (-) than #1",
        height=460,
    )
    return fig


def _measured_section(search: MeasuredSearch, top: int) -> tuple[str, list[go.Figure]]:
    """The measured search as the terminal shows it (the same rows, ranks and numbers), its
    failures, and predicted vs measured throughput."""
    ranking = search.ranking
    done = ranking[ranking["ranked_by"] == "measured"]
    table = _table("measured", list(MEASURED_HEAD), measured_rows(search, top))
    failures = "".join(
        f"<li>{html.escape(c)} {html.escape(w)} {html.escape(t)}</li>"
        for c, w, t in failure_lines(search)
    )
    ran = f" The trials ran in {search.precision}." if search.precision else ""
    text = (
        "<h2>Measured trials</h2><p class='note'>Ranked by measured throughput where measured, "
        f"by the prediction otherwise, scaled by {search.scale:.3g} (the median "
        f"measured/predicted ratio) so the two compare.{ran}</p>"
        + table
        + (f"<p>Failed or refused trials:</p><ul>{failures}</ul>" if failures else "")
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
                name="measured trials",
                text=done["label"],
                hovertemplate="%{text}<br>predicted %{x:,.0f}<br>measured %{y:,.0f}<extra></extra>",
            )
        )
        top_value = float(
            max(
                done["pred_tokens_per_s_per_gpu"].max(), done["measured_tokens_per_s_per_gpu"].max()
            )
        )
        fig.add_trace(
            go.Scatter(
                x=[0, top_value], y=[0, top_value], mode="lines", name="measured = predicted"
            )
        )
    fig.update_layout(
        title="Predicted (unscaled) vs measured tokens/s/GPU",
        xaxis_title="predicted",
        yaxis_title="measured",
        height=460,
    )
    return text, [fig]


def render(
    result: SearchResult,
    top_k: int = 10,
    measured: MeasuredSearch | None = None,
    tokens: float | None = None,
    gpu_hour_usd: float | None = None,
) -> str:
    a = result.context()
    answered = result.answers(tokens, gpu_hour_usd)
    feasible = answered[answered["pruned"] == ""]
    top = feasible.head(top_k)
    ran = measured.precision if measured is not None else ""
    inputs = {
        "model": a["model"],
        "GPUs": f"{a['gpus']} x {a['gpu']}",
        "sequence length": a["seq_len"],
        "global batch": f"{a['gbs']}" + (" (chosen by autoconfig)" if a["gbs_chosen"] else ""),
        "precision": a["precision"]
        + (f" (predictions); the trials ran in {ran}" if ran and ran != a["precision"] else ""),
        "enumerated": f"{a['enumerated']:,}",
        "evaluated": f"{a['evaluated']:,}",
        "feasible": f"{a['feasible']:,}",
    }
    if tokens:
        inputs["training tokens"] = f"{tokens:,.0f}"
    if gpu_hour_usd:
        inputs["price of a GPU-hour"] = f"${gpu_hour_usd:g}"
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
            _relative_steps(top, tuple((lbl, c) for lbl, c in TIME_PARTS)),
        ]
    if measured is not None:
        text, extra = _measured_section(measured, top_k)
        parts.append(text)
        figures = extra + figures
    for i, fig in enumerate(figures):
        parts.append(pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"plot{i}"))
    body = "\n".join(parts)
    script = inline_plotly()
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>autoconfig "
        f"{html.escape(a['model'])}</title><style>{STYLE}</style>"
        f"<script type='text/javascript'>{script}</script></head><body>{body}"
        f"</body></html>"
    )
