"""Terminal views of measured work: a measured search's ranking and failures, and a
calibration's before/after table."""

from __future__ import annotations

import math

import numpy as np
from rich.console import Group
from rich.markup import escape
from rich.table import Table

from autoconfig.measure.calibrate import Calibration
from autoconfig.measure.result import MeasuredSearch


def measured_view(search: MeasuredSearch, top: int) -> Group:
    """A measured search: measured where measured, predicted otherwise, then every failure
    with its class and reason."""
    ranked, trials = search.ranking, search.trials
    measured = trials[trials["class"] == "ok"] if len(trials) else trials
    table = Table(
        title="measured search: measured where measured, predicted otherwise", show_header=True
    )
    for col in ("#", "layout", "ranked by", "measured tok/s/GPU", "predicted", "model error"):
        table.add_column(col, justify="left" if col in ("layout", "ranked by") else "right")
    shown = ranked[(ranked["ranked_by"] == "measured") | (ranked.index < top)]
    for _, r in shown.head(max(top, len(measured))).iterrows():
        m = r["measured_tokens_per_s_per_gpu"]
        table.add_row(
            str(r["rank"]),
            escape(r["label"]),
            r["ranked_by"],
            "-" if math.isnan(m) else f"{m:,.0f}",
            f"{r['pred_tokens_per_s_per_gpu']:,.0f}",
            "-" if math.isnan(r["error_pct"]) else f"{r['error_pct']:+.0f}%",
        )
    lines: list[object] = [table]
    if len(measured):
        errors = measured["error_pct"].abs().dropna()
        lines.append(
            f"{len(measured)} measured; the model's median absolute error on them "
            f"{errors.median():.0f}%; unmeasured predictions scaled by "
            f"{search.scale:.3g} (median measured/predicted)"
        )
    failures = trials[~trials["class"].isin(["ok", "running"])] if len(trials) else trials
    for _, f in failures.iterrows():
        where = f"trial {f['trial']}" if f["trial"] >= 0 else "not run"
        lines.append(
            f"[yellow]{f['class']}[/yellow] {where} {escape(f['layout'])}: {escape(f['reason'])}"
        )
    lines += [f"[red]{escape(line)}[/red]" for line in search.diagnosis()]
    return Group(*lines)


def calibration_view(c: Calibration) -> Group:
    """Each trial's measured throughput with the prediction before and after, the refitted
    constants and the median error."""
    table = Table(title=f"calibration of {c.base.name} on {len(c.trials)} trials")
    for col in ("trial", "layout", "measured", "before", "after"):
        table.add_column(col, justify="left" if col in ("trial", "layout") else "right")
    for _, r in c.table().iterrows():
        table.add_row(
            r["trial"],
            escape(r["layout"]),
            f"{r['measured']:,.0f}",
            f"{r['before']:,.0f} ({100 * (r['before'] / r['measured'] - 1):+.0f}%)",
            f"{r['after']:,.0f} ({100 * (r['after'] / r['measured'] - 1):+.0f}%)",
        )
    old = c.base.efficiency
    moved = ", ".join(f"{k} {getattr(old, k)} -> {v:.4g}" for k, v in sorted(c.constants.items()))
    return Group(
        table,
        f"constants: {moved}",
        f"median absolute error of tokens/s/GPU on {len(c.trials)} trials: "
        f"{np.median(c.error(c.before)):.1f}% before, {np.median(c.error(c.after)):.1f}% after",
    )
