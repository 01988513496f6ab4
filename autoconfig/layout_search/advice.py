"""When nothing fits: the closest candidate and which single change makes it fit, computed by
re-evaluating the changed layouts with the cost model (not a canned sentence)."""

from __future__ import annotations

import pandas as pd

from autoconfig.columns import frameworks
from autoconfig.columns.build import Hardware, training_inputs
from autoconfig.cost import evaluate
from autoconfig.cost.inputs import busiest_rank_layers
from autoconfig.layout_search.result import SearchRequest
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
    if rows:
        layouts = layout.frame_of([r for _, r in rows])
        r = request
        inputs = training_inputs(
            r.model,
            Hardware(r.gpu, r.cluster, r.precision),
            layouts,
            r.gbs,
            r.seq_len,
            frameworks.behaviour(r.framework, r.precision, float(r.flash_attention)),
        )
        out = evaluate(inputs)
        for i, (label, _) in enumerate(rows):
            peak = float(out["pred_peak_mem_gib"][i])
            verdict = "fits" if peak <= best["mem_limit_gib"] else "still too big"
            lines.append(f"  with {label}: {peak:.1f} GiB ({verdict})")
    return lines


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
