"""`estimate --compare` in the terminal: the user's layout beside the search's best."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from autoconfig.layout_search.compare import Comparison
from autoconfig.layout_search.rank import top_row
from autoconfig.report.terminal import LEFT


def compare_view(c: Comparison) -> Group:
    mine = c.mine
    speed = float(mine["pred_tokens_per_s_per_gpu"])
    lines: list[str] = []
    if c.best is None:
        return Group("compare: no layout of the search fits, so there is nothing to rank against")
    table = Table(title="your layout against the search", title_justify="left")
    best = top_row(c.best)
    for col in best:
        table.add_column(col, justify="left" if col in LEFT else "right")
    yours = top_row(_as_row(mine, c))
    table.add_row(*best.values())
    table.add_row(*yours.values())
    if c.rank is None:
        lines.append(
            f"your layout does not fit, so it has no rank among the {c.feasible:,} that do; "
            f"the best runs {float(c.best['pred_tokens_per_s_per_gpu']):,.0f} tokens/s/GPU"
        )
    else:
        where = "" if c.in_search else " (a layout the search does not enumerate: by its speed)"
        lines.append(
            f"your layout ranks #{c.rank:,} of {c.feasible:,} feasible layouts{where}; "
            f"the best is {100 * c.gain:.1f}% faster "
            f"({float(c.best['pred_tokens_per_s_per_gpu']):,.0f} vs {speed:,.0f} tokens/s/GPU)"
        )
    for change in c.changes:
        lines.append(f"  {change.text}: +{100 * change.gain:.1f}%")
    if c.rank is not None and not c.changes:
        lines.append("  no single change of tp, pp, cp, ep, mbs, recompute or zero is faster")
    return Group(table, *lines)


def _as_row(mine, c: Comparison):
    row = mine.copy()
    row["rank"] = "you" if c.rank is None else f"{c.rank}"
    if "mem_limit_gib" not in row:
        row["mem_limit_gib"] = row["mem_capacity_gib"]
    return row
