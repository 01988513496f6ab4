"""A capacity plan in the terminal (the answer, then every GPU count tried) and as an HTML
plot of days and cost against GPU count."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
from rich.console import Group
from rich.table import Table

from autoconfig.base.fileio import write_text
from autoconfig.layout_search.plan import Plan, Point

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
    for p in plan.points:
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
    lines.append(ENERGY_NOTE)
    return Group(table, *lines)


def write_html(plan: Plan, out: Path) -> Path:
    """days and cost against GPU count, one line per GPU type, the limits dashed."""
    from plotly.subplots import make_subplots  # here: importing it costs ~30 ms

    priced = any(p.cost_usd is not None for p in plan.points)
    fig = make_subplots(
        rows=1,
        cols=2 if priced else 1,
        subplot_titles=("days to train", "cost (USD)") if priced else ("days to train",),
    )
    for gpu in plan.answers:
        pts = [p for p in plan.points if p.gpu == gpu and p.ok]
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
    if g.max_days is not None:
        fig.add_hline(y=g.max_days, line_dash="dash", annotation_text="deadline", row=1, col=1)
    if priced and g.budget_usd is not None:
        fig.add_hline(y=g.budget_usd, line_dash="dash", annotation_text="budget", row=1, col=2)
    for c in range(1, 3 if priced else 2):
        fig.update_xaxes(title_text="GPUs", type="log", row=1, col=c)
    fig.update_yaxes(type="log")
    chosen = plan.chosen or plan.closest
    title = f"{plan.model}: " + (_summary(chosen) if chosen else "no plan")
    fig.update_layout(title=title, height=480, margin={"t": 90})
    body = pio.to_html(fig, include_plotlyjs="cdn", full_html=True)
    path = out / "plan.html"
    out.mkdir(parents=True, exist_ok=True)
    write_text(path, body)
    return path
