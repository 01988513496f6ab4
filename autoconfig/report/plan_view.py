"""A capacity plan in the terminal (the answer, then the GPU counts tried that someone might
run), its progress while it searches, and an offline HTML plot of days and cost against GPU
count."""

from __future__ import annotations

import html
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
from rich.console import Console, Group
from rich.table import Table

from autoconfig.base.fileio import write_text
from autoconfig.layout_search.plan import MFU_FLOOR_OF_MEDIAN, Plan, Point, Progress, shown
from autoconfig.report.html import inline_plotly

ENERGY_NOTE = "energy: GPU board power (TDP) x GPUs x hours only; no CPUs, network or cooling"


def _money(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}"


def _summary(p: Point) -> str:
    cost = f", ${p.cost_usd:,.0f}" if p.cost_usd is not None else ""
    energy = f", {p.energy_kwh:,.0f} kWh" if p.energy_kwh is not None else ""
    return (
        f"{p.gpus:,} x {p.gpu}: {p.days:,.1f} days{cost}, {p.gpu_hours:,.0f} GPU-hours{energy}; "
        f"layout {p.label}, {p.best['pred_tokens_per_s_per_gpu']:,.0f} tokens/s/GPU, "
        f"MFU {100 * p.best['pred_mfu']:.1f}%"
    )


def plan_view(plan: Plan) -> Group:
    g = plan.goal
    asked = [f"{g.tokens:.3g} tokens"]
    if g.max_days is not None:
        asked.append(f"within {g.max_days:g} days")
    if g.budget_usd is not None:
        asked.append(f"within ${g.budget_usd:,.0f}")
    table = Table(title=f"{plan.model}: {', '.join(asked)}", title_justify="left")
    for col in (
        "GPU",
        "GPUs",
        "layout",
        "tokens/s/GPU",
        "MFU",
        "days",
        "GPU-hours",
        "cost $",
        "kWh",
        "meets",
    ):
        table.add_column(col, justify="left" if col in ("GPU", "layout", "meets") else "right")
    kept, left = shown(plan)
    for p in kept:
        mark = "yes" if p.meets(g) else ""
        if p is plan.chosen:
            mark = "[bold]chosen[/bold]"
        if not p.ok:
            table.add_row(p.gpu, f"{p.gpus:,}", p.reason, "", "", "", "", "", "", "")
            continue
        table.add_row(
            p.gpu,
            f"{p.gpus:,}",
            p.label,
            f"{p.best['pred_tokens_per_s_per_gpu']:,.0f}",
            f"{100 * p.best['pred_mfu']:.1f}%",
            f"{p.days:,.1f}",
            f"{p.gpu_hours:,.0f}",
            _money(p.cost_usd),
            _money(p.energy_kwh),
            mark,
        )
    lines: list[str] = [f"gbs: {plan.gbs_rule}"]
    if plan.chosen is not None:
        lines.insert(0, f"plan: {_summary(plan.chosen)}")
        if len(plan.answers) > 1:
            for gpu, p in plan.answers.items():
                if p is not plan.chosen:
                    lines.append(f"  {gpu}: " + (_summary(p) if p else "meets nothing tried"))
    elif plan.closest is not None:
        c = plan.closest
        miss = ", ".join(
            f"{'days' if k == 'days' else 'cost'} over by {100 * v:.0f}%"
            for k, v in c.misses(g).items()
        )
        lines.insert(0, f"nothing meets the goal; closest: {_summary(c)} ({miss})")
    else:
        lines.insert(0, "nothing meets the goal: no GPU count tried has a layout that fits")
    if left:
        lines.append(left_out_line(left))
    lines.append(ENERGY_NOTE)
    return Group(table, *lines)


def left_out_line(left: dict[str, list[Point]]) -> str:
    """The rule that kept counts out of the table and the plot, with the counts it kept out."""
    why = {
        "dominated": "slower than a count with no more GPUs",
        "low MFU": f"under {100 * MFU_FLOOR_OF_MEDIAN:g}% of the median MFU of the counts tried",
        "no layout": "no layout uses that many GPUs",
    }
    parts = [
        f"{why[k]} ({', '.join(f'{p.gpus:,}' for p in pts)})" for k, pts in left.items() if pts
    ]
    return "left out, as no one would run them: " + "; ".join(parts)


@contextmanager
def progress(model: str, console: Console | None = None) -> Iterator[Progress | None]:
    """While a plan searches: a status line on stderr naming the count being searched, and a
    line for each count when its search is done. None (nothing shown) when stderr is not a
    terminal, where the lines would only fill a log."""
    console = console or Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    with console.status(f"planning {model} ...") as status:

        def tell(gpu: str, gpus: int, point: Point | None) -> None:
            if point is None:
                status.update(f"planning {model}: searching {gpus:,} x {gpu} ...")
            elif point.ok:
                console.print(
                    f"  {gpus:,} x {gpu}: {point.days:,.1f} days, "
                    f"MFU {100 * point.best['pred_mfu']:.1f}%",
                    highlight=False,
                )
            else:
                console.print(f"  {gpus:,} x {gpu}: {point.reason}", highlight=False)

        yield tell


def write_html(plan: Plan, out: Path) -> Path:
    """days and cost against GPU count, one line per GPU type (the counts the table shows),
    the limits dashed; plotly.js embedded, so the page draws offline."""
    path = out / "plan.html"
    write_text(path, render_html(plan))
    return path


def render_html(plan: Plan) -> str:
    """plan.html's text: the figure and the embedded plotly.js bundle the search report uses."""
    from plotly.subplots import make_subplots  # here: importing it costs ~30 ms

    kept, left = shown(plan)
    priced = any(p.cost_usd is not None for p in kept)
    fig = make_subplots(
        rows=1,
        cols=2 if priced else 1,
        subplot_titles=("days to train", "cost (USD)") if priced else ("days to train",),
    )
    for gpu in plan.answers:
        pts = [p for p in kept if p.gpu == gpu and p.ok]
        x = [p.gpus for p in pts]
        fig.add_trace(
            go.Scatter(x=x, y=[p.days for p in pts], name=f"{gpu} days", mode="lines+markers"),
            row=1,
            col=1,
        )
        if priced:
            fig.add_trace(
                go.Scatter(
                    x=x, y=[p.cost_usd for p in pts], name=f"{gpu} cost", mode="lines+markers"
                ),
                row=1,
                col=2,
            )
    g = plan.goal
    limits = [(g.max_days, "deadline", 1)]
    if priced:
        limits.append((g.budget_usd, "budget", 2))
    for value, text, col in limits:
        if value is None:
            continue
        # A shape's y is in data units, an annotation's on a log axis is log10 of the value.
        fig.add_hline(y=value, line_dash="dash", row=1, col=col)
        axis = "" if col == 1 else str(col)
        fig.add_annotation(
            text=text,
            xref=f"x{axis} domain",
            x=1,
            yref=f"y{axis}",
            y=math.log10(value),
            xanchor="right",
            yanchor="bottom",
            showarrow=False,
        )
    for c in range(1, 3 if priced else 2):
        fig.update_xaxes(title_text="GPUs", type="log", row=1, col=c)
    fig.update_yaxes(type="log")
    chosen = plan.chosen or plan.closest
    title = f"{plan.model}: " + (_summary(chosen) if chosen else "no plan")
    fig.update_layout(title=title, height=480, margin={"t": 90})
    figure = pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id="plan")
    note = f"<p>{html.escape(left_out_line(left))}</p>" if left else ""
    script = inline_plotly()
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>autoconfig plan "
        f"{html.escape(plan.model)}</title><script type='text/javascript'>{script}</script>"
        f"</head><body>{figure}{note}<p>{html.escape(ENERGY_NOTE)}</p></body></html>"
    )
