"""Views of an inference search: the rich table, the self-contained HTML report (top table and
the Pareto front of latency against throughput with the budget lines drawn) and the files."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from rich.console import Group
from rich.table import Table

from autoconfig.base import resources
from autoconfig.base.fileio import csv_text
from autoconfig.measure.result import MeasuredSearch
from autoconfig.report.files import json_text, measured_files, plain_row, write_report
from autoconfig.report.html import STYLE, _table, inline_plotly
from autoconfig.serve import fewest
from autoconfig.serve.result import ServingResult
from autoconfig.serve.search import pareto_front

ACCURACY = "inference_accuracy.json"  # written by scripts/validate_inference.py
QUANTISATION_CAVEAT = (
    "accuracy: fp8 / nvfp4 / int8 / int4 weights and fp8 K/V trade some model quality for "
    "speed; check your task's quality on the quantised checkpoint before deploying it"
)
LADDER_TOP_NOTE = (
    "≥: the limits held at every rate simulated, up to the steady-state maximum (or, for "
    "disaggregated pools, the highest rate tried): the goodput is at least this"
)
# The weight and K/V formats the caveat is about: those below 16 bits.
QUANTISED = frozenset({"fp8", "nvfp4", "int8", "int4"})


def quantised(rows: pd.DataFrame) -> bool:
    """Whether any of the deployments shown holds a quantised weight or K/V format (the
    prefill pool of a disaggregated one included)."""
    columns = [c for c in ("precision", "kv_precision", "prefill_precision") if c in rows]
    return any(str(v) in QUANTISED for c in columns for v in rows[c].dropna())


def accuracy_note() -> str:
    asset = resources.asset(ACCURACY)
    if not asset.is_file():
        return "The serving model's accuracy has not been measured for this installation."
    acc = json.loads(asset.read_text())
    note = (
        f"Known accuracy (docs/inference_validation.md): static batches, {acc['rows']} published "
        f"A100 points, median absolute error of end-to-end latency "
        f"{acc['latency_median_ape_pct']:.1f}% ({acc['latency_within_20_pct']:.0f}% within "
        "±20%)"
    )
    if "inflight_rows" in acc:
        note += (
            f"; continuous batching at max load, {acc['inflight_rows']} TensorRT-LLM points "
            "on H100, H200, B200, GB200 and RTX PRO 6000, median absolute error of output "
            f"tokens/s {acc['inflight_median_ape_pct']:.1f}% "
            f"({acc['inflight_within_20_pct']:.0f}% within ±20%; held-out "
            f"{acc['inflight_heldout_median_ape_pct']:.1f}%). Percentile latencies under load "
            "come from the scheduler simulation and have no published check."
        )
    return note + "."


def row_cells(row: pd.Series, percentile: float | None = None) -> dict[str, str]:
    """The cells every view of the serving ranking shows for one configuration (continuous
    batching when a percentile is given)."""
    rank = row["rank"]
    if percentile is not None:
        return continuous_cells(row, percentile)
    return {
        "#": "-" if pd.isna(rank) else str(rank),
        "tp": str(int(row["tp"])),
        "pp": str(int(row["pp"])),
        "replicas": str(int(row["replicas"])),
        "batch seqs per replica": str(int(row["batch_size"])),
        "precision": f"{row['precision']}/{row['kv_precision']}",
        "TTFT ms": f"{row['pred_ttft_ms']:,.0f}",
        "TPOT ms": f"{row['pred_tpot_ms']:,.1f}",
        "latency ms": f"{row['pred_latency_ms']:,.0f}",
        "tok/s/GPU": f"{row['pred_output_tokens_per_s_per_gpu']:,.1f}",
        "tok/s total": f"{row['pred_output_tokens_per_s']:,.0f}",
        "KV GiB/GPU": f"{row['mem_kv_cache_gib']:.1f}",
        "headroom GiB/GPU": f"{row['kv_headroom_gib']:.1f}",
        "Pareto": "*" if row["pareto"] else "",
    }


def continuous_cells(row: pd.Series, percentile: float) -> dict[str, str]:
    rank = row["rank"]
    p = f"p{percentile:g}"

    def ms(value: object) -> str:
        return "-" if pd.isna(value) else ("never" if value == float("inf") else f"{value:,.0f}")

    def goodput(value: object, fmt: str) -> str:
        # met the limits at the highest rate tried: the deployment takes at least this much
        bound = "≥ " if bool(row.get("goodput_at_ladder_top", False)) else ""
        return "-" if pd.isna(value) else f"{bound}{value:{fmt}}"

    mixed = _is_mixed(row)
    if row.get("mode") == "disaggregated":
        # mixed pools: each pool's GPU type before its layout
        p_gpu, d_gpu = (f"{row['prefill_gpu']} ", f"{row['decode_gpu']} ") if mixed else ("", "")
        prefill = f"tp{int(row['prefill_tp'])} pp{int(row['prefill_pp'])}"
        layout = (
            f"P {p_gpu}{prefill} x{int(row['prefill_replicas'])}"
            f" + D {d_gpu}tp{int(row['tp'])} pp{int(row['pp'])} x{int(row['replicas'])}"
        )
    else:
        ep = f" ep{int(row['ep'])}" if int(row.get("ep", 1)) > 1 else ""
        layout = f"tp{int(row['tp'])} pp{int(row['pp'])}{ep} x{int(row['replicas'])}"
    cells = {
        "#": "-" if pd.isna(rank) else str(rank),
        "deployment": layout,
        "precision": f"{row['precision']}/{row['kv_precision']}",
        "max seqs per replica": str(int(row["max_num_seqs"])),
        "max tokens per iteration": str(int(row["max_num_batched_tokens"])),
        "goodput req/s total": goodput(row["goodput_rps"], ",.2f"),
        "goodput req/s/GPU": goodput(row["goodput_rps_per_gpu"], ",.3f"),
        "at req/s total": "-" if pd.isna(row["rate_rps"]) else f"{row['rate_rps']:,.2f}",
        f"TTFT {p} ms": ms(row.get(f"ttft_{p}_ms")),
        f"TPOT {p} ms": "-" if pd.isna(row.get(f"tpot_{p}_ms")) else f"{row[f'tpot_{p}_ms']:,.1f}",
        f"latency {p} ms": ms(row.get(f"latency_{p}_ms")),
        "tok/s/GPU": "-"
        if pd.isna(row["pred_output_tokens_per_s_per_gpu"])
        else f"{row['pred_output_tokens_per_s_per_gpu']:,.0f}",
        "KV GiB/GPU": f"{row['kv_cache_gib']:.1f}",
    }
    if mixed:
        # goodput per GPU above is over both budgets; what the deployment leaves unused:
        cells["spare GPUs P/D"] = (
            f"{int(row['spare_prefill_gpus'])}/{int(row['spare_decode_gpus'])}"
        )
        per_usd = row.get("goodput_requests_per_usd")
        if per_usd is not None and not pd.isna(per_usd):
            cells["requests per USD"] = f"{per_usd:,.0f}"
    return cells


def _is_mixed(row: pd.Series) -> bool:
    """Whether the row is a mixed-pools deployment (each pool on its own GPU type)."""
    gpu = row.get("decode_gpu")
    return isinstance(gpu, str) and bool(gpu)


def _both_modes_tried(result: ServingResult) -> bool:
    """Whether the search tried disaggregated pools beside colocated replicas (continuous
    batching, disaggregation on, at least two GPUs: serve/continuous.py)."""
    r = result.request
    return r.batching == "continuous" and r.disaggregation and r.gpus >= 2


def mode_comparison(result: ServingResult) -> str | None:
    """One line comparing the best colocated and the best disaggregated deployment that meet
    the limits: goodput per GPU, TTFT and TPOT at the percentile, and which takes more
    requests/s per GPU by how much. None when disaggregation was not tried. Mixed pools: each
    GPU type alone against the mixed pools (serve/mixed.py)."""
    if result.mixed:
        return result.comparison or None
    if not _both_modes_tried(result):
        return None
    out = result.table
    p = f"p{result.request.percentile:g}"
    best: dict[str, pd.Series | None] = {}
    for mode in ("colocated", "disaggregated"):
        met = out[(out["mode"] == mode) & out["meets"].astype(bool)]
        best[mode] = met.iloc[0] if len(met) else None  # the table is ranked: first is best

    def said(mode: str) -> str:
        row = best[mode]
        if row is None:
            return f"{mode}: none meets the limits"
        bound = "≥ " if bool(row.get("goodput_at_ladder_top", False)) else ""
        layout = continuous_cells(row, result.request.percentile)["deployment"]
        tpot = row.get(f"tpot_{p}_ms")
        tpot_text = "-" if pd.isna(tpot) else f"{tpot:,.1f} ms"
        return (
            f"{mode} {layout} {bound}{row['goodput_rps_per_gpu']:,.3f} req/s/GPU "
            f"(TTFT {p} {row[f'ttft_{p}_ms']:,.0f} ms, TPOT {p} {tpot_text})"
        )

    head = f"colocated vs disaggregated: {said('colocated')}; {said('disaggregated')}"
    one, two = best["colocated"], best["disaggregated"]
    if one is None or two is None:
        if one is None and two is None:
            return head
        winner = "colocated" if two is None else "disaggregated"
        return f"{head}: {winner} only"
    a, b = float(one["goodput_rps_per_gpu"]), float(two["goodput_rps_per_gpu"])
    if max(a, b) <= 0 or abs(a - b) <= 0.005 * max(a, b):
        return f"{head}: they tie on goodput per GPU"
    win, (win_row, lose_row) = ("colocated", (one, two)) if a > b else ("disaggregated", (two, one))
    margin = max(a, b) / min(a, b) - 1.0 if min(a, b) > 0 else float("inf")
    # A goodput marked ≥ is a lower bound: the margin is then a bound too.
    win_bound = bool(win_row.get("goodput_at_ladder_top", False))
    lose_bound = bool(lose_row.get("goodput_at_ladder_top", False))
    how = "at least " if win_bound and not lose_bound else "at most " if lose_bound else ""
    if win_bound and lose_bound:
        how = "about "
    by = "more" if margin == float("inf") else f"{how}{margin:.0%} more"
    return f"{head}: {win} wins, {by} goodput per GPU"


def _percentile(result: ServingResult) -> float | None:
    return result.request.percentile if result.request.batching == "continuous" else None


def limits_text(budget: dict[str, float], none: str) -> str:
    """The limits asked for, each with its unit: the latencies in ms, the throughput in output
    tokens/s of the whole deployment."""
    parts = [
        f"{k} {v:g} tokens/s total" if k == "throughput" else f"{k} {v:g} ms"
        for k, v in budget.items()
    ]
    return ", ".join(parts) or none


def _gpus_text(a: dict) -> str:
    """The GPUs of a result's context: N x type, or each pool's count and type."""
    if a.get("decode_gpu"):
        return (
            f"{a['gpus']} x {a['gpu']} (prefill) + {a['decode_gpus']} x {a['decode_gpu']} (decode)"
        )
    return f"{a['gpus']} x {a['gpu']}"


def _title(a: dict) -> str:
    if a.get("batching") == "continuous":
        budget = limits_text(a["budget"], "no limits")
        rate = (
            f"at {a['request_rate']:g} requests/s in total"
            if a.get("request_rate")
            else "most requests/s (goodput)"
        )
        return (
            f"{a['model']} on {_gpus_text(a)}, continuous batching: {rate} within "
            f"{budget} at p{a['percentile']:g}"
        )
    budget = limits_text(a["budget"], "no budget")
    return (
        f"{a['model']} serving on {a['gpus']} x {a['gpu']}: input {a['input_len']}, output "
        f"{a['output_len']} tokens; {budget}; objective {a['objective']}"
    )


def _shown(result: ServingResult, top: int) -> pd.DataFrame:
    """The best that meet the budget, or (when none does) the fitting ones closest to it."""
    out = result.table
    if result.feasible:
        return out[out["meets"]].head(top)
    if _percentile(result) is not None:
        return out[out["simulated"]].sort_values("miss", kind="stable").head(top)
    return out[out["pred_fits"].astype(bool)].sort_values("miss", kind="stable").head(top)


def terminal_view(result: ServingResult, top: int) -> Group:
    a = result.context()
    out = result.table
    table = Table(title=_title(a), title_justify="left")
    rows = _shown(result, top)
    percentile = _percentile(result)
    for i, (_, row) in enumerate(rows.iterrows()):
        cells = row_cells(row, percentile)
        if i == 0:
            for col in cells:
                table.add_column(col, justify="right")
        table.add_row(*cells.values())
    if percentile is not None:
        fits = int(out["fits"].astype(bool).sum())
        simulated = int(out["simulated"].astype(bool).sum())
        counted = (
            f"{a['candidates']:,} candidates: {fits:,} fit in memory, {simulated:,} simulated "
            f"at a ladder of request rates, {a['feasible']:,} meet the limits"
        )
        if result.mixed:
            counted = (
                f"{a['candidates']:,} pairings of a prefill layout on {a['gpu']} with a decode "
                f"layout on {a['decode_gpu']} (one K/V format), each role simulated on its own "
                f"type, {a['feasible']:,} meet the limits; goodput per GPU over all "
                f"{result.request.gpus + int(result.request.decode_gpus or 0):,} GPUs, the spare "
                "ones included"
            )
        lines = [
            f"workload: {a['workload']} (change with --input-len/--output-len, "
            "--workload or --requests)",
            counted,
            f"serving constants: {a['constants']}",
        ]
        if rows.get("goodput_at_ladder_top", pd.Series(dtype=bool)).astype(bool).any():
            lines.append(LADDER_TOP_NOTE)
        comparison = mode_comparison(result)
        if comparison is not None:
            lines.insert(0, comparison)
        if result.features:
            lines.insert(1, result.features)
    else:
        fits = int(out["pred_fits"].astype(bool).sum())
        lines = [
            f"{a['candidates']:,} (tp, pp, batch) candidates: {fits:,} fit in memory, "
            f"{a['feasible']:,} meet the budget; * = on their Pareto front of latency vs "
            "tokens/s/GPU",
            f"serving constants: {a['constants']}",
        ]
    if quantised(rows):
        lines.append(QUANTISATION_CAVEAT)
    if not a["feasible"]:
        lines.insert(0, f"nothing meets the budget; closest: {a['closest']}")
    return Group(table, *lines)


def _count_cells(row: pd.Series) -> dict[str, str]:
    """One GPU count of the fewest-GPU search as table cells."""

    def num(value: object, fmt: str) -> str:
        return "-" if value is None or pd.isna(value) else format(value, fmt)

    bound = "≥ " if bool(row["goodput_at_ladder_top"]) else ""
    goodput = num(row["goodput_rps"], ",.2f")
    return {
        "GPU": str(row["gpu"]),
        "GPUs": str(int(row["gpus"])),
        "meets": ("yes" if row["meets"] else "no") + (" (chosen)" if row["chosen"] else ""),
        "goodput req/s": goodput if goodput == "-" else bound + goodput,
        "TTFT ms": num(row["ttft_ms"], ",.0f"),
        "TPOT ms": num(row["tpot_ms"], ",.1f"),
        "USD/h": num(row["usd_per_hour"], ",.2f"),
        "best deployment, or why none": str(row["deployment"] or row["why"]),
    }


def fewest_answer(found: fewest.Fewest) -> str:
    """The fewest-GPU search's answer in one line (or that nothing up to the limit meets)."""
    rate = f"{found.request_rate:g} requests/s"
    if found.chosen is None:
        most = max((c.gpus for c in found.tried), default=0)
        return (
            f"no GPU count tried (up to {most:,}) takes {rate} within the limits; raise "
            "--max-gpus or loosen the limits"
        )
    c = found.chosen
    assert c.result is not None  # a count that meets has its search
    from autoconfig.serve.goodput import label_of

    cost = f" at {c.usd_per_hour:,.2f} USD/h" if c.usd_per_hour is not None else ""
    which = "cheapest" if found.priced else "fewest GPUs"
    head = (
        f"{which}: {c.gpus} x {c.gpu}{cost}"
        if len(found.answers) > 1
        else (f"fewest GPUs: {c.gpus} x {c.gpu}{cost}")
    )
    others = [
        f"{gpu} {a.gpus}" if a is not None else f"{gpu} none"
        for gpu, a in found.answers.items()
        if a is not c
    ]
    tail = f" (fewest of the others: {', '.join(others)})" if others else ""
    return f"{head} take {rate} within the limits with {label_of(c.result.table.iloc[0])}{tail}"


def fewest_view(found: fewest.Fewest, top: int) -> Group:
    """The chosen count's deployments, the GPU counts tried, and the answer."""
    counts = fewest.table(found)
    grid = Table(
        title=f"GPU counts tried for {found.request_rate:g} requests/s in total",
        title_justify="left",
    )
    for i, (_, row) in enumerate(counts.iterrows()):
        cells = _count_cells(row)
        if i == 0:
            for col in cells:
                grid.add_column(col, justify="right")
        grid.add_row(*cells.values())
    parts: list[object] = []
    if found.chosen is not None and found.chosen.result is not None:
        parts.append(terminal_view(found.chosen.result, top))
    parts.append(grid)
    parts.append(fewest_answer(found))
    if not found.priced and len(found.answers) > 1:
        parts.append(fewest.UNPRICED)
    return Group(*parts)  # type: ignore[arg-type]


def write_fewest(found: fewest.Fewest, folder: Path) -> None:
    """gpu_counts.csv (every count tried) and, for the chosen count, results.csv, best.json
    and report.html (with the counts tried and the answer)."""
    counts = fewest.table(found)
    chosen = found.chosen.result if found.chosen is not None else None
    if chosen is None:
        write_report(folder, {"gpu_counts.csv": csv_text(counts)})
        return
    write(chosen, folder, counts=counts, answer=fewest_answer(found))


def _pareto_figure(result: ServingResult) -> go.Figure:
    """Latency metrics against throughput per GPU, the front highlighted, budgets as lines."""
    from plotly.subplots import make_subplots  # here: importing it costs ~30 ms

    a = result.context()
    out = result.table
    fitting = out[out["pred_fits"].astype(bool)]
    panels = (("pred_ttft_ms", "TTFT"), ("pred_tpot_ms", "TPOT"), ("pred_latency_ms", "latency"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{p} (ms)" for _, p in panels])
    labels = (
        "tp"
        + fitting["tp"].astype(str)
        + " pp"
        + fitting["pp"].astype(str)
        + " x"
        + fitting["replicas"].astype(str)
        + " b"
        + fitting["batch_size"].astype(str)
    )
    for i, (col, name) in enumerate(panels, start=1):
        for meets, group in (
            (True, fitting[fitting["meets"]]),
            (False, fitting[~fitting["meets"]]),
        ):
            fig.add_trace(
                go.Scatter(
                    x=group[col],
                    y=group["pred_output_tokens_per_s_per_gpu"],
                    mode="markers",
                    name="meets the budget" if meets else "misses the budget",
                    legendgroup=str(meets),
                    showlegend=i == 1,
                    marker={"size": 6, "color": "#1f77b4" if meets else "#bbbbbb"},
                    text=labels[group.index],
                    hovertemplate="%{text}<br>%{x:,.1f} ms<br>%{y:,.1f} tok/s/GPU<extra></extra>",
                ),
                row=1,
                col=i,
            )
        eligible = fitting[fitting["meets"]] if fitting["meets"].any() else fitting
        for kind, pool in (("all that fit", fitting), ("within the budget", eligible)):
            line = pool[pareto_front(pool, col=col)].sort_values(col)
            fig.add_trace(
                go.Scatter(
                    x=line[col],
                    y=line["pred_output_tokens_per_s_per_gpu"],
                    mode="lines+markers",
                    name=f"Pareto front, {kind}",
                    legendgroup=kind,
                    showlegend=i == 1,
                    line={"color": "#d62728", "dash": "dot" if kind == "all that fit" else "solid"},
                    marker={"size": 4},
                ),
                row=1,
                col=i,
            )
        if name in a["budget"]:
            fig.add_vline(x=a["budget"][name], line_dash="dash", line_color="black", row=1, col=i)
        fig.update_xaxes(type="log", title_text=f"{name} ms", row=1, col=i)
    if "throughput" in a["budget"]:
        per_gpu = a["budget"]["throughput"] / a["gpus"]
        fig.add_hline(y=per_gpu, line_dash="dash", line_color="black")
    fig.update_yaxes(title_text="output tokens/s per GPU", row=1, col=1)
    fig.update_layout(title="Latency against throughput (dashed: the budget)", height=520)
    return fig


def _goodput_figure(result: ServingResult) -> go.Figure:
    """Simulated candidates: goodput per GPU against their percentile TTFT and TPOT at the
    operating rate, the limits as dashed lines."""
    from plotly.subplots import make_subplots  # here: importing it costs ~30 ms

    a = result.context()
    p = f"p{a['percentile']:g}"
    sim = result.table[result.table["simulated"].astype(bool)]
    panels = ((f"ttft_{p}_ms", "TTFT"), (f"tpot_{p}_ms", "TPOT"))
    fig = make_subplots(rows=1, cols=2, subplot_titles=[f"{name} {p} (ms)" for _, name in panels])
    labels = sim["mode"] + " tp" + sim["tp"].astype(str) + " pp" + sim["pp"].astype(str)
    labels += " " + sim["precision"].astype(str) + " seqs " + sim["max_num_seqs"].astype(str)
    for i, (col, name) in enumerate(panels, start=1):
        for meets, group in ((True, sim[sim["meets"]]), (False, sim[~sim["meets"]])):
            fig.add_trace(
                go.Scatter(
                    x=group[col],
                    y=group["goodput_rps_per_gpu"],
                    mode="markers",
                    name="meets the limits" if meets else "misses",
                    legendgroup=str(meets),
                    showlegend=i == 1,
                    marker={"size": 7, "color": "#1f77b4" if meets else "#bbbbbb"},
                    text=labels[group.index],
                    hovertemplate="%{text}<br>%{x:,.1f} ms<br>%{y:,.3f} req/s/GPU<extra></extra>",
                ),
                row=1,
                col=i,
            )
        if name in a["budget"]:
            fig.add_vline(x=a["budget"][name], line_dash="dash", line_color="black", row=1, col=i)
        fig.update_xaxes(type="log", title_text=f"{name} {p} ms", row=1, col=i)
    fig.update_yaxes(title_text="goodput, requests/s per GPU", row=1, col=1)
    fig.update_layout(title="Simulated deployments (dashed: the limits)", height=480)
    return fig


def _measured_section(trials: pd.DataFrame) -> str:
    """The measured trials: class, measured against predicted throughput, TTFT and TPOT."""

    def num(value: object, fmt: str) -> str:
        return "-" if value is None or pd.isna(value) else format(value, fmt)

    rows = []
    for _, t in trials.iterrows():
        rows.append(
            [
                str(t["trial"]),
                t["layout"],
                t["class"],
                num(t["measured_tokens_per_s_per_gpu"], ",.1f"),
                num(t["pred_tokens_per_s_per_gpu"], ",.1f"),
                num(t["error_pct"], "+.0f"),
                num(t.get("measured_ttft_ms"), ",.1f"),
                num(t.get("pred_ttft_ms"), ",.1f"),
                num(t.get("measured_tpot_ms"), ",.2f"),
                num(t.get("pred_tpot_ms"), ",.2f"),
                t["reason"],
            ]
        )
    head = [
        "trial",
        "point",
        "class",
        "measured tok/s/GPU",
        "predicted tok/s/GPU",
        "error %",
        "measured TTFT ms",
        "predicted TTFT ms",
        "measured TPOT ms",
        "predicted TPOT ms",
        "reason",
    ]
    return "<h2>Measured trials</h2>" + _table("measured", head, rows)


def render(
    result: ServingResult,
    top: int = 15,
    trials: pd.DataFrame | None = None,
    counts: pd.DataFrame | None = None,
    answer: str = "",
) -> str:
    a = result.context()
    out = result.table
    percentile = _percentile(result)
    if percentile is not None:
        return _render_continuous(result, top, trials, counts, answer)
    inputs = {
        "model": a["model"],
        "GPUs": f"{a['gpus']} x {a['gpu']}",
        "input / output tokens": f"{a['input_len']} / {a['output_len']}",
        "weights / KV precision": f"{a['precision']} / {a['kv_precision']}",
        "budget": limits_text(result.budget, "none"),
        "objective": a["objective"],
        "candidates": f"{a['candidates']:,}",
        "meet the budget": f"{a['feasible']:,}",
        "serving constants": a["constants"],
    }
    shown = _shown(result, top)
    rows = [list(row_cells(r).values()) for _, r in shown.iterrows()]
    head = list(row_cells(out.iloc[0]).keys())
    parts = [
        f"<h1>autoconfig serving: {html.escape(a['model'])} on {a['gpus']} GPUs</h1>",
        "<table id='inputs'>"
        + "".join(f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in inputs.items())
        + "</table>",
        f"<p class='note'>{html.escape(accuracy_note())}</p>",
    ]
    if quantised(shown):
        parts.append(f"<p class='note'>{html.escape(QUANTISATION_CAVEAT)}</p>")
    if not a["feasible"]:
        parts.append(
            f"<p><b>Nothing meets the budget.</b> Closest: {html.escape(a['closest'])}</p>"
        )
    parts.append("<h2>Configurations</h2>" + _table("top", head, rows))
    if trials is not None and len(trials):
        parts.append(_measured_section(trials))
    parts.append(_figure_html(_pareto_figure(result), 0))
    return _page(str(a["model"]), parts)


def _figure_html(fig: go.Figure, index: int) -> str:
    """A figure's div and drawing call; plotly.js itself is in the page's head, once."""
    return pio.to_html(fig, include_plotlyjs=False, full_html=False, div_id=f"plot{index}")


def _page(model: str, parts: list[str]) -> str:
    """The page, with the search report's basic plotly.js bundle (scatter traces, a quarter of
    the full library) embedded once in its head, so it draws offline and stays small."""
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>autoconfig serving "
        f"{html.escape(model)}</title><style>{STYLE}</style>"
        f"<script type='text/javascript'>{inline_plotly()}</script></head><body>"
        + "\n".join(parts)
        + "</body></html>"
    )


def _render_continuous(
    result: ServingResult,
    top: int,
    trials: pd.DataFrame | None,
    counts: pd.DataFrame | None = None,
    answer: str = "",
) -> str:
    a = result.context()
    percentile = float(a["percentile"])
    inputs = {
        "model": a["model"],
        "GPUs": _gpus_text(a),
        **(
            {"USD per GPU-hour": ", ".join(f"{p:g}" for p in result.request.gpu_hour_usd)}
            if result.mixed and result.request.gpu_hour_usd
            else {}
        ),
        "workload": a["workload"],
        "limits": limits_text(result.budget, "none"),
        "percentile": f"p{percentile:g}",
        "request rate": f"{a['request_rate']:g} req/s total"
        if a["request_rate"]
        else "most (goodput)",
        **({"engine features": result.features} if result.features else {}),
        "candidates": f"{a['candidates']:,}",
        "meet the limits": f"{a['feasible']:,}",
        "serving constants": a["constants"],
    }
    shown = _shown(result, top)
    rows = [list(row_cells(r, percentile).values()) for _, r in shown.iterrows()]
    head = list(row_cells(result.table.iloc[0], percentile).keys())
    where = _gpus_text(a) if result.mixed else f"{a['gpus']} GPUs"
    parts = [
        f"<h1>autoconfig serving: {html.escape(a['model'])} on {where}</h1>",
        "<table id='inputs'>"
        + "".join(f"<tr><th>{k}</th><td>{html.escape(str(v))}</td></tr>" for k, v in inputs.items())
        + "</table>",
        f"<p class='note'>{html.escape(accuracy_note())}</p>",
    ]
    if quantised(shown):
        parts.append(f"<p class='note'>{html.escape(QUANTISATION_CAVEAT)}</p>")
    if not a["feasible"]:
        parts.append(
            f"<p><b>Nothing meets the limits.</b> Closest: {html.escape(a['closest'])}</p>"
        )
    if counts is not None and len(counts):
        cells = [_count_cells(r) for _, r in counts.iterrows()]
        parts.append(
            f"<h2>GPU counts tried</h2><p class='summary' id='answer'>{html.escape(answer)}</p>"
            + _table("counts", list(cells[0]), [list(c.values()) for c in cells])
        )
    comparison = mode_comparison(result)
    if comparison is not None:
        parts.append(f"<p class='summary' id='modes'>{html.escape(comparison)}</p>")
    parts.append("<h2>Deployments</h2>" + _table("top", head, rows))
    if shown.get("goodput_at_ladder_top", pd.Series(dtype=bool)).astype(bool).any():
        parts.append(f"<p class='note'>{html.escape(LADDER_TOP_NOTE)}</p>")
    if trials is not None and len(trials):
        parts.append(_measured_section(trials))
    parts.append(_figure_html(_goodput_figure(result), 0))
    return _page(str(a["model"]), parts)


def write(
    result: ServingResult,
    folder: Path,
    measured: MeasuredSearch | None = None,
    counts: pd.DataFrame | None = None,
    answer: str = "",
) -> None:
    """results.csv (every candidate), best.json and report.html; with a measured search also
    trials.csv (every trial) and measured.csv (measured where measured, else predicted); with
    the GPU `counts` of a fewest-GPU search also gpu_counts.csv, and its `answer`."""
    trials = measured.trials if measured is not None else None
    best: dict[str, object] = {"inputs": result.context(), "best": plain_row(result.best)}
    comparison = mode_comparison(result)
    if comparison is not None:
        key = "each_type_vs_mixed" if result.mixed else "colocated_vs_disaggregated"
        best[key] = comparison
    if measured is not None:  # the trials by class, as the search's best.json has them
        best["measured"] = measured.summary()
    if answer:
        best["fewest_gpus"] = answer
    files = {
        "results.csv": csv_text(result.table),
        "best.json": json_text(best),
        "report.html": render(result, trials=trials, counts=counts, answer=answer),
    }
    if counts is not None:
        files["gpu_counts.csv"] = csv_text(counts)
    if measured is not None:
        files.update(measured_files(measured))
    write_report(folder, files)  # one set: a killed run leaves the old files or the new
