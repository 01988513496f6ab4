"""Terminal views of measured work: a measured search's ranking and failures, and a
calibration's before/after table."""

from __future__ import annotations

import numpy as np
from rich.console import Group
from rich.markup import escape
from rich.table import Table

from autoconfig.measure.calibrate import Calibration
from autoconfig.measure.result import MeasuredSearch
from autoconfig.report.terminal import MEASURED_HEAD, failure_lines, measured_rows


def measured_view(search: MeasuredSearch, top: int) -> Group:
    """A measured search: measured where measured, predicted otherwise, then every failure
    with its class and reason."""
    trials = search.trials
    measured = trials[trials["class"] == "ok"] if len(trials) else trials
    table = Table(
        title="measured search: measured where measured, predicted otherwise", show_header=True
    )
    for col in MEASURED_HEAD:
        table.add_column(col, justify="left" if col in ("layout", "ranked by") else "right")
    for cells in measured_rows(search, top):
        table.add_row(*(escape(c) for c in cells))
    lines: list[object] = [table]
    if len(measured):
        errors = measured["error_pct"].abs().dropna()
        lines.append(
            f"{len(measured)} measured; the model's median absolute error on them "
            f"{errors.median():.0f}%; unmeasured predictions scaled by "
            f"{search.scale:.3g} (median measured/predicted)"
            + (f"; the trials ran in {search.precision}" if search.precision else "")
        )
    for cls, where, what in failure_lines(search):
        lines.append(f"[yellow]{cls}[/yellow] {where} {escape(what)}")
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
    verdict = (
        f"fit refused, the profile keeps its constants: {c.refused}"
        if c.refused
        else "fit kept: trials held out of the fit are predicted better than before"
    )
    return Group(
        table,
        *c.moves(),
        f"median absolute error of tokens/s/GPU on {len(c.trials)} trials: "
        f"{np.median(c.error(c.before)):.1f}% before, {np.median(c.error(c.after)):.1f}% after; "
        f"on trials held out of the fit: {c.heldout_before:.1f}% before, "
        f"{c.heldout_after:.1f}% after",
        verdict,
    )
