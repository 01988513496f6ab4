"""Rich terminal views: a search's ranking, one estimate's breakdown, a measured search, a
calibration, and the model/GPU catalog tables."""

from __future__ import annotations

import math
import sys
import textwrap

import pandas as pd
from rich.console import Console, Group
from rich.table import Table

from autoconfig.layout_search.rank import (
    EQUAL_SPEED,
    MEMORY_RISK_RULE,
    NEAR_TIE,
    NEAR_TIE_SOURCE,
    RANK_COLUMN,
    SPREAD,
    TIE_RULES,
    top_row,
)
from autoconfig.layout_search.result import SearchResult
from autoconfig.measure.result import MeasuredSearch
from autoconfig.spec import layout
from autoconfig.spec.schema import GPUSpec, ModelSpec

MEMORY_PARTS = (
    ("weights", "mem_weights_gib"),
    ("gradients", "mem_gradients_gib"),
    ("optimizer states", "mem_optimizer_gib"),
    ("activations (1 micro-batch)", "mem_activations_gib"),
    ("pipeline in-flight", "mem_pipeline_in_flight_gib"),
    ("logits / embedding buffers", "mem_logits_embedding_gib"),
    ("recompute / gather working set", "mem_transient_gib"),
    ("overhead allowance", "mem_overhead_gib"),
)
TIME_PARTS = (
    ("compute (fwd+bwd+recompute)", "time_compute_s"),
    ("kernel-launch bound", "time_launch_s"),
    ("TP communication", "time_tp_comm_s"),
    ("CP communication", "time_cp_comm_s"),
    ("EP communication", "time_ep_comm_s"),
    ("PP communication", "time_pp_comm_s"),
    ("pipeline bubble", "time_bubble_s"),
    ("DP communication (exposed)", "time_dp_comm_s"),
    ("optimizer + step overhead", "time_optimizer_s"),
    ("CPU offload (host link, CPU Adam, activations)", "time_offload_s"),
)


MEASURED_HEAD = (
    "#",
    "layout",
    "ranked by",
    "measured tok/s/GPU",
    "predicted (scaled)",
    "predicted",
    "model error",
)


def measured_rows(search: MeasuredSearch, top: int) -> list[list[str]]:
    """The cells of the measured ranking, the same in the terminal and in report.html."""
    rows = []
    for _, r in search.shown(top).iterrows():
        m = r["measured_tokens_per_s_per_gpu"]
        rows.append(
            [
                str(r["rank"]),
                r["label"],
                r["ranked_by"],
                "-" if math.isnan(m) else f"{m:,.0f}",
                f"{r['scaled_pred_tokens_per_s_per_gpu']:,.0f}",
                f"{r['pred_tokens_per_s_per_gpu']:,.0f}",
                "-" if math.isnan(r["error_pct"]) else f"{r['error_pct']:+.0f}%",
            ]
        )
    return rows


def failure_lines(search: MeasuredSearch) -> list[tuple[str, str, str]]:
    """(class, where, 'layout: reason') of every failed or refused trial."""
    trials = search.trials
    failures = trials[~trials["class"].isin(["ok", "running"])] if len(trials) else trials
    out = []
    for _, f in failures.iterrows():
        where = f"trial {f['trial']}" if f["trial"] >= 0 else "not run"
        out.append((f["class"], where, f"{f['layout']}: {f['reason']}"))
    return out


LEFT = ("layout", "recompute", "memory risk", "tie broken by")


def answer_cells(row: pd.Series) -> dict[str, str]:
    """Days, GPU-hours and cost of a row of SearchResult.answers (none without --tokens)."""
    cells = {}
    if "days" in row:
        cells["days"] = f"{row['days']:,.1f}"
        cells["GPU-hours"] = f"{row['gpu_hours']:,.0f}"
    if "cost_usd" in row:
        cells["cost $"] = f"{row['cost_usd']:,.0f}"
    return cells


def near_tie_line(count: int) -> str:
    return (
        f"~ marks near-ties: within {100 * NEAR_TIE:g}% of the best conservative estimate, "
        f"{NEAR_TIE_SOURCE} ({count} configurations); among near-ties a layout without memory "
        f"risk is listed first ({MEMORY_RISK_RULE}); layouts within {100 * EQUAL_SPEED:g}% run "
        f"at equal speed and are ordered by: {', '.join(name for name, _ in TIE_RULES)}; "
        "'tie broken by' names the rule that put a layout above a faster one listed below it"
    )


def spread_line() -> str:
    """What the ranking sorts by, what the spread and the memory flag mean, and their sources."""
    return (
        f"ranked by '{RANK_COLUMN}', the conservative end of tokens/s/GPU (low-high): "
        f"{SPREAD.source}; memory risk: {SPREAD.memory_source}"
    )


# The parallel groups, innermost first, as the communication table names them.
COMM_GROUPS = {
    "tp": "TP",
    "cp": "CP",
    "ep": "EP",
    "pp": "PP",
    "dp": "DP (over dp x cp)",
    "edp": "expert DP",
}


def estimate_view(row: pd.Series) -> Group:
    """The breakdown of one estimate (a row of autoconfig.estimate)."""
    resolved = row
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("model", f"{row['model']} on {int(row['num_gpus'])} x {row['gpu']}")
    head.add_row(
        "layout",
        f"{layout.label(row)}  mbs {int(resolved['mbs'])}  gbs {int(row['gbs'])}"
        f"  seq {int(row['seq_len'])}",
    )
    head.add_row(
        "options",
        f"recompute {resolved['recompute']}  zero {int(resolved['zero'])}  "
        f"{resolved['precision']}  flash {'on' if resolved['flash_attention'] else 'off'}"
        f"  sp {'on' if resolved['sp'] else 'off'}",
    )

    cap = float(row.get("mem_limit_gib", row["mem_capacity_gib"]))
    mem = Table(title="Memory per GPU (GiB)", title_justify="left")
    mem.add_column("part")
    mem.add_column("GiB", justify="right")
    mem.add_column("share", justify="right")
    total = float(row["pred_peak_mem_gib"])
    for label, col in MEMORY_PARTS:
        value = float(row[col])
        mem.add_row(label, f"{value:,.2f}", f"{100 * value / total:.0f}%" if total else "")
    verdict = "[green]fits[/green]" if bool(row["pred_fits"]) else "[red]does not fit[/red]"
    mem.add_row("[bold]peak[/bold]", f"[bold]{total:,.2f}[/bold]", f"of {cap:.1f} GiB: {verdict}")
    host = float(row.get("mem_host_gib", 0.0))
    if host > 0:
        # CPU offload: beside the GPU's peak, against the host memory a GPU has where known
        room = float(row.get("host_capacity_gib", float("nan")))
        known = f"of {room:.0f} GiB per GPU" if room == room else "host memory not in the profile"
        held = [f"offload {row.get('offload', '')}"] if row.get("offload", "none") != "none" else []
        held += ["activations"] if bool(row.get("activation_offload", False)) else []
        mem.add_row(f"host memory ({', '.join(held) or 'offload'})", f"{host:,.2f}", known)

    step = float(row["pred_step_time_s"])
    tim = Table(title="Step time (s)", title_justify="left")
    tim.add_column("part")
    tim.add_column("seconds", justify="right")
    tim.add_column("share", justify="right")
    for label, col in TIME_PARTS:
        value = float(row[col])
        if value > 0:
            tim.add_row(label, f"{value:,.4f}", f"{100 * value / step:.1f}%")
    tim.add_row("[bold]step[/bold]", f"[bold]{step:,.4f}[/bold]", "")

    links = Table(title="Communication by group", title_justify="left")
    for name, justify in (("group", "left"), ("ranks", "right"), ("link", "left")):
        links.add_column(name, justify=justify)
    links.add_column("bus GB/s per GPU", justify="right")
    links.add_column("exposed s", justify="right")
    for group, label in COMM_GROUPS.items():
        ranks = int(row.get(f"comm_{group}_ranks", 1))
        if ranks > 1:
            # expert and dense gradients share one exposed figure (timing._data_parallel)
            time_column = "time_dp_comm_s" if group == "edp" else f"time_{group}_comm_s"
            links.add_row(
                label,
                f"{ranks:,}",
                "NVLink domain" if row[f"comm_{group}_link"] == "nvlink" else "network",
                f"{float(row[f'comm_{group}_bus_gb_s']):,.0f}",
                "counted in DP" if group == "edp" else f"{float(row[time_column]):,.4f}",
            )

    perf = Table.grid(padding=(0, 2))
    perf.add_column(style="bold")
    perf.add_column(justify="right")
    perf.add_row("tokens/s/GPU", f"{float(row['pred_tokens_per_s_per_gpu']):,.0f}")
    perf.add_row("model TFLOP/s/GPU", f"{float(row['pred_model_tflops_per_gpu']):,.1f}")
    perf.add_row("MFU", f"{100 * float(row['pred_mfu']):.1f}%")
    parts = [head, "", mem, "", tim, ""] + ([links, ""] if links.row_count else [])
    return Group(*parts, perf)


def _count(n: int) -> str:
    """Parameter counts in billions, or millions for the small test models."""
    return f"{n / 1e9:,.2f}B" if n >= 1e9 else f"{n / 1e6:,.2f}M"


def models_table(models: list[ModelSpec]) -> Table:
    table = Table(title="Models")
    for col in (
        "name",
        "params",
        "active",
        "layers",
        "hidden",
        "heads/kv",
        "ffn",
        "vocab",
        "mlp",
        "norm",
        "seq",
    ):
        table.add_column(col, justify="left" if col in ("name", "mlp", "norm") else "right")
    for m in models:
        active = m.param_count(active_only=True)
        table.add_row(
            m.name,
            _count(m.param_count()),
            _count(active) if m.is_moe else "",
            str(m.layers),
            str(m.hidden),
            f"{m.heads}/{m.kv}",
            str(m.expert_ffn if m.is_moe else m.ffn),
            str(m.vocab),
            m.mlp + (f" {m.num_experts}x top{m.topk}" if m.is_moe else ""),
            m.norm,
            str(m.seq_len),
        )
    return table


def gpus_table(gpus: list[GPUSpec]) -> Table:
    table = Table(title="GPUs")
    for col in (
        "name",
        "bf16 TFLOP/s",
        "fp8",
        "HBM GiB",
        "TB/s",
        "NVLink GB/s",
        "net GB/s",
        "GEMM eff",
        "calibration",
    ):
        table.add_column(col, justify="left" if col in ("name", "calibration") else "right")
    for g in gpus:
        fp8 = g.peak_tflops.get("fp8")
        table.add_row(
            g.name,
            f"{g.peak('bf16'):g}",
            f"{fp8:g}" if fp8 else "-",
            f"{g.memory_gib:g}",
            f"{g.memory_tb_s:g}",
            f"{g.cluster.intra_node_gb_s:g}",
            f"{g.cluster.inter_node_gb_s:g}",
            f"{g.efficiency.gemm:.2f}",
            # whole words: a cut mid-word reads as a typo
            textwrap.shorten(g.efficiency.provenance.split(";")[0], 60, placeholder=" ..."),
        )
    return table


def print_view(view: object) -> None:
    # Piped output (files, CI logs) gets a wide fixed width instead of rich's 80 columns.
    Console(width=None if sys.stdout.isatty() else 160).print(view)


def search_view(
    result: SearchResult, top: int, tokens: float | None, gpu_hour_usd: float | None
) -> Group:
    """The top configurations, the pruning summary and why the winner wins."""
    a = result.context()
    ranked = result.table
    feasible = result.ranked.head(top)
    table = Table(
        title=f"{a['model']} on {a['gpus']} x {a['gpu']}: seq {a['seq_len']}, "
        f"gbs {a['gbs']}, {a['precision']}",
        title_justify="left",
    )
    answered = result.answers(tokens, gpu_hour_usd).head(len(feasible))
    for i, (_, row) in enumerate(answered.iterrows()):
        cells = top_row(row)
        if row["near_tie"] and row["rank"] != 1:
            cells["#"] += "~"
        cells |= answer_cells(row)
        if i == 0:
            for col in cells:
                table.add_column(col, justify="left" if col in LEFT else "right")
        table.add_row(*cells.values())
    dropped = sum(a["dropped"].values())
    lines = [
        f"{a['enumerated']:,} candidates enumerated: {dropped:,} broke a divisibility rule, "
        f"{a['evaluated']:,} evaluated, {a['feasible']:,} feasible"
        + "".join(f"; {n:,} pruned for {k}" for k, n in a["pruned"].items()),
    ]
    if a["gbs_chosen"]:
        lines.append(f"default gbs: {a['gbs_rule']}")
    if a["explanation"]:
        lines.append(a["explanation"])
    lines.extend(result.advice)
    if a["feasible"]:
        lines.append(spread_line())
    if a["feasible"] and (ranked["near_tie"].sum() > 1):
        lines.append(near_tie_line(int(ranked["near_tie"].sum())))
    return Group(table, *lines)
