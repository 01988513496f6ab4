"""When nothing fits: the closest candidate and which single change makes it fit, computed by
re-evaluating the changed layouts with the cost model (not a canned sentence): the memory-only
changes (ZeRO, recompute, micro-batch) and, for one given layout, the smallest change of tp, pp
and cp on the same GPUs."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from autoconfig.columns import frameworks
from autoconfig.columns.build import Hardware, training_inputs
from autoconfig.cost import evaluate
from autoconfig.cost.inputs import busiest_rank_layers
from autoconfig.layout_search.result import SearchRequest
from autoconfig.layout_search.space import mlp_split_rule
from autoconfig.spec import layout
from autoconfig.spec.vocab import Recompute, ZeroStage


def closest_fix(table: pd.DataFrame, request: SearchRequest) -> list[str]:
    """Lines describing the closest memory-pruned candidate and the changes that fit it."""
    mem = table[table["pruned"].str.startswith("memory")]
    if mem.empty:
        return []
    ratio = mem["pred_peak_mem_gib"] / mem["mem_limit_gib"]
    best = mem.loc[ratio.idxmin()]
    lines = [
        f"closest: {layout.label(best)} mbs {best['mbs']} recompute {best['recompute']} "
        f"zero {best['zero']} needs {best['pred_peak_mem_gib']:.1f} GiB per GPU, "
        f"limit {best['mem_limit_gib']:.1f} GiB"
    ]
    # Every layer of the busiest stage (an uneven split's larger share included).
    per_stage = int(busiest_rank_layers(request.model.layers, int(best["pp"]), int(best["vp"])))
    changes = {
        "ZeRO-3 (shard weights, gradients and optimizer)": {"zero": ZeroStage.WEIGHTS},
        "ZeRO-1 (distributed optimizer)": {"zero": max(int(best["zero"]), 1)},
        "full activation recompute": {
            "recompute": Recompute.FULL.value,
            "recompute_layers": per_stage,
        },
        "micro-batch 1": {"mbs": 1},
    }
    rows = []
    for label, change in changes.items():
        if all(best[k] == v for k, v in change.items()):
            continue
        if change.get("zero", 0) > 0 and int(best["dp"]) * int(best["cp"]) == 1:
            continue
        rows.append((label, {**layout.plain(best), **change}))
    if rows:  # only changes the layout and framework rules let run (not ZeRO-3 with hybrid CP)
        allowed = runs(request, layout.frame_of([r for _, r in rows]))[0]
        rows = [row for row, ok in zip(rows, allowed, strict=True) if ok]
    if rows:
        out = _evaluate(layout.frame_of([r for _, r in rows]), request)
        for i, (label, _) in enumerate(rows):
            peak = float(out["pred_peak_mem_gib"][i])
            verdict = "fits" if peak <= best["mem_limit_gib"] else "still too big"
            lines.append(f"  with {label}: {peak:.1f} GiB ({verdict})")
    return lines


def runs(
    r: SearchRequest, frame: pd.DataFrame, layout_rules: bool = True
) -> tuple[np.ndarray, str]:
    """Which layouts of `frame` the framework runs (every one of its rules; with
    `layout_rules`, spec.layout's too), and the first reason one is refused ('' when none
    is): the one rule check of the search's derived layouts and of the advice."""
    codes = {
        **layout.columns(frame),
        "heads": r.model.heads,
        "kv_heads": r.model.kv,
        "layers": r.model.layers,
        "experts": r.model.num_experts,
        "num_gpus": r.gpus,
        "gbs": r.gbs,
        "seq": r.seq_len,
    }
    ok = np.ones(len(frame), bool)
    first = ""
    checks = frameworks.rules(r.framework, codes)
    if layout_rules:
        checks = layout.rules(codes) + checks
    with np.errstate(all="ignore"):
        for name, rule, bad in checks:
            bad = np.broadcast_to(np.asarray(bad, bool), ok.shape)
            if not first and np.any(bad & ok):
                first = f"{name}: {rule}"
            ok &= ~bad
    return ok, first


def _evaluate(layouts: pd.DataFrame, request: SearchRequest) -> dict[str, np.ndarray]:
    """The cost model's predictions for `layouts` run as `request` asks."""
    r = request
    inputs = training_inputs(
        r.model,
        Hardware(r.gpu, r.cluster, r.precision),
        layouts,
        r.gbs,
        r.seq_len,
        frameworks.behaviour(r.framework, r.precision, float(r.flash_attention), r.task),
    )
    with np.errstate(all="ignore"):
        return evaluate(inputs)


def _doubled(row: pd.Series, steps: dict[str, int], keep_vp: bool) -> dict[str, object]:
    """`row`'s layout with tp, pp and cp each doubled `steps[name]` times on the same GPUs: dp
    halves once per doubling, sp follows tp as the defaults set it, vp stays where the pipeline
    does (or where pp*vp still divides the layers), and full recompute covers at most the new
    stage's layers."""
    new = layout.plain(row)
    for name, times in steps.items():
        new[name] = int(row[name]) * 2**times
    new["dp"] = int(row["dp"]) // 2 ** sum(steps.values())
    if int(row["tp"]) == 1 and new["tp"] > 1:
        new["sp"] = True
    if steps["pp"] and not keep_vp:
        new["vp"] = 1
    if new["recompute"] == Recompute.FULL.value:
        held = int(busiest_rank_layers(float(row["layers"]), new["pp"], new["vp"]))
        new["recompute_layers"] = min(int(row["recompute_layers"]), held)
    return new


def parallel_fix(row: pd.Series, request: SearchRequest) -> list[str]:
    """The smallest change of tp, pp and cp that makes the layout `row` fit on its GPUs: the
    fewest doublings (dp halving with each, so the GPU count stays), each candidate held to the
    layout rules, what the framework runs and the search space's own limits (tp within a node
    unless the space allows more, cp with enough tokens per rank), and evaluated by the cost
    model; of the fitting ones with that many doublings, the fastest. One line, or one saying
    why none fits."""
    r = request
    limit = float(row["mem_limit_gib"])
    dp = int(row["dp"])
    most = (dp & -dp).bit_length() - 1  # doublings that keep dp whole: its factors of two
    gpus = f"{r.gpus:,} GPU{'s' if r.gpus > 1 else ''}"
    if most == 0:
        return [f"  no tp, pp or cp change keeps {gpus}: dp is {dp}, with no factor of 2 to trade"]
    row = row.copy()
    row["layers"] = r.model.layers
    candidates = []
    for k in range(1, most + 1):
        for a, b in itertools.product(range(k + 1), repeat=2):
            if a + b > k:
                continue
            steps = {"tp": a, "pp": b, "cp": k - a - b}
            for keep_vp in {True, int(row["vp"]) == 1}:
                candidates.append((k, _doubled(row, steps, keep_vp)))
    frame = layout.frame_of([c for _, c in candidates]).drop_duplicates()
    doublings = pd.Series([k for k, _ in candidates]).loc[frame.index].to_numpy()
    frame = frame.reset_index(drop=True)
    ok = runs(r, frame)[0]
    tp, pp, vp, cp = (frame[n].to_numpy() for n in ("tp", "pp", "vp", "cp"))
    ok &= (vp == 1) | (r.model.layers % (pp * vp) == 0)  # interleaving: equal chunks
    widths = {"tp": frame["tp"].to_numpy(), "etp": frame["etp"].to_numpy()}
    for _, bad in mlp_split_rule(widths, r.model):  # as the search and the trainer refuse
        ok &= ~bad
    if not r.space.allow_tp_across_nodes:
        ok &= tp <= r.cluster.gpus_per_node
    ok &= (cp == 1) | (r.seq_len / cp >= r.space.min_tokens_per_cp_rank)
    if not ok.any():
        return [f"  no tp, pp or cp change on {gpus} passes the layout rules"]
    frame, doublings = frame[ok].reset_index(drop=True), doublings[ok]
    out = _evaluate(frame, r)
    peak = np.asarray(out["pred_peak_mem_gib"], float)
    speed = np.asarray(out["pred_tokens_per_s_per_gpu"], float)
    fits = peak <= limit
    if not fits.any():
        low = int(np.argmin(peak))
        return [
            f"  no tp, pp or cp change on {gpus} fits: the smallest peak is "
            f"{peak[low]:.1f} GiB, with {_moves(row, frame.iloc[low])}"
        ]
    fewest = doublings[fits].min()
    pick = np.flatnonzero(fits & (doublings == fewest))
    best = int(pick[np.argmax(speed[pick])])
    times = "doubling" if fewest == 1 else "doublings"
    return [
        f"  with {_moves(row, frame.iloc[best])} ({fewest} {times}, the fewest that fit on "
        f"{gpus}): {peak[best]:.1f} GiB (fits), {speed[best]:,.0f} tokens/s/GPU"
    ]


def _moves(old: pd.Series, new: pd.Series) -> str:
    """'tp 1 -> 4, pp 1 -> 2 with dp 8 -> 1, sp off -> on': the moved dimensions, then those
    that follow them."""

    def shown(name: str, value: object) -> str:
        if isinstance(value, bool | np.bool_):
            return "on" if value else "off"
        return str(value)

    a, b = layout.plain(old), layout.plain(new)
    changed = [n for n in layout.NAMES if str(a[n]) != str(b[n])]
    text = [f"{n} {shown(n, a[n])} -> {shown(n, b[n])}" for n in changed]
    moved = [t for n, t in zip(changed, text, strict=True) if n in ("tp", "pp", "cp")]
    follow = [t for n, t in zip(changed, text, strict=True) if n not in ("tp", "pp", "cp")]
    return ", ".join(moved) + (f" with {', '.join(follow)}" if follow else "")


def fixed_values_missing(table: pd.DataFrame, request: SearchRequest) -> list[str]:
    """Lines for each --fix value no evaluated layout has, and why: not among the space's
    values, or every layout with it broke a divisibility rule."""
    lines = []
    for name, value in request.constraints.fixed.items():
        plain = layout.BY_NAME[name].plain(value)
        if (table[name] == plain).any():
            continue
        tried = getattr(request.space, name, None)
        tried_plain = [layout.BY_NAME[name].plain(v) for v in tried] if tried else []
        if tried is not None and plain not in tried_plain:
            listed = ", ".join(str(v) for v in tried_plain)
            lines.append(
                f"fix: {name}={plain} is not among the space's {name} values ({listed}); "
                f"add it with --space"
            )
        else:
            lines.append(
                f"fix: no layout with {name}={plain} passes the layout rules for "
                f"{request.model.name} on {request.gpus} GPUs (see the divisibility counts)"
            )
    return lines
