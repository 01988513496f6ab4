"""The inference search: every (tp, pp, batch, replicas) for the GPUs, predicted at once, checked
against memory and the latency/throughput budget, ranked by the objective, with the Pareto
front of end-to-end latency against throughput per GPU."""

from __future__ import annotations

import numpy as np
import pandas as pd

from autoconfig.base import checks
from autoconfig.base.errors import UserError
from autoconfig.base.intmath import divisors
from autoconfig.columns.build import serving_inputs
from autoconfig.cost.inference import evaluate_serving
from autoconfig.serve import no_fit
from autoconfig.serve.request import Budget, Request
from autoconfig.serve.result import ServingResult
from autoconfig.spec import catalog
from autoconfig.spec.schema import ClusterSpec, GPUSpec, ModelSpec
from autoconfig.spec.vocab import KvPrecision, Objective, ServePrecision


def _check(req: Request, spec: ModelSpec) -> None:
    for name in ("gpus", "input_len", "output_len", "max_batch"):
        checks.integer(getattr(req, name), name.replace("_", "-"))
    ServePrecision.parse(req.precision, "precision")
    KvPrecision.parse(req.kv_precision, "kv-precision")
    Objective.parse(req.objective, "objective")
    for b in req.batches or ():
        checks.integer(b, "batch")
    req.budget.check()
    context = spec.max_seq_len or spec.seq_len
    if req.input_len + req.output_len > context:
        raise UserError(
            f"input-len: input + output = {req.input_len + req.output_len} tokens exceeds "
            f"{spec.name}'s context of {context} tokens"
        )
    gpu = catalog.get_gpu(req.gpu)
    if req.precision == "fp8" and "fp8" not in gpu.peak_tflops:
        raise UserError(f"precision: {gpu.name} has no fp8 tensor cores (use int8 or bf16)")


def tp_degrees(spec: ModelSpec, limit: int, node: int, across: bool) -> list[int]:
    """TP degrees the heads allow: dividing the query heads, and dividing the K/V heads or
    a multiple of them (K/V heads are then replicated)."""
    out = []
    for tp in divisors(spec.heads, limit):  # tp divides the heads: no need to walk to `limit`
        if spec.kv % tp and tp % spec.kv:
            continue
        if tp > node and not across:
            continue
        out.append(tp)
    return out


def _batches(req: Request) -> list[int]:
    """The static batch sizes tried: 1, 2, 3, 4, 6, 8, 12, ... (powers of two and 1.5x them)
    up to max_batch, and max_batch itself."""
    if req.batches:
        return sorted(set(req.batches))
    out, b = {1}, 1
    while b <= req.max_batch:
        out.update({b, b + b // 2} if b > 1 else {b})
        b *= 2
    return sorted({x for x in out if x <= req.max_batch} | {req.max_batch})


def predict(
    req: Request,
    spec: ModelSpec,
    hardware: tuple[GPUSpec, ClusterSpec],
    layouts: list[tuple[int, int]],
    batches: list[int],
    gpus: int | None = None,
) -> pd.DataFrame:
    """Predictions for every (tp, pp) layout at every batch size: the deployment columns, then
    the pred_* figures and breakdowns. `gpus` is the deployment's size (default: one
    replica)."""
    tps = np.array([t for t, _ in layouts for _ in batches], dtype=float)
    pps = np.array([p for _, p in layouts for _ in batches], dtype=float)
    weights = ServePrecision.parse(req.precision, "precision")
    deployments = pd.DataFrame(
        {
            "tp": tps,
            "pp": pps,
            "batch_size": np.tile(np.array(batches, dtype=float), len(layouts)),
            "input_len": float(req.input_len),
            "output_len": float(req.output_len),
            "replicas": (gpus / (tps * pps)) if gpus else 1.0,
            "precision": weights.value,
            "kv_precision": KvPrecision.parse(req.kv_precision, "kv-precision")
            .resolve(weights)
            .value,
        }
    )
    with np.errstate(all="ignore"):
        preds = evaluate_serving(serving_inputs(spec, hardware, deployments))
    out = pd.concat([deployments, pd.DataFrame(preds)], axis=1)
    return out.astype({"tp": int, "pp": int, "batch_size": int, "replicas": int})


def _layouts(req: Request, spec: ModelSpec, node: int) -> list[tuple[int, int]]:
    out = []
    for tp in tp_degrees(spec, req.gpus, node, req.allow_tp_across_nodes):
        if req.gpus % tp:
            continue
        for pp in divisors(req.gpus // tp, spec.layers):
            out.append((tp, pp))
    return out


def min_gpus(req: Request, spec: ModelSpec, node: int) -> tuple[int, str] | None:
    """The fewest GPUs on which one sequence of this length fits, and the split that does it."""
    layouts = [
        (tp, pp)
        for tp in tp_degrees(spec, 4 * node, node, True)
        for pp in range(1, min(spec.layers, 4 * node) + 1)  # up to 4 nodes, as the message says
    ]
    gpu = catalog.get_gpu(req.gpu)
    pred = predict(req, spec, (gpu, catalog.cluster_for(gpu, req.gpus_per_node)), layouts, [1])
    ok = pred[pred["pred_fits"].astype(bool)]
    if ok.empty:
        return None
    best = ok.assign(n=ok["tp"] * ok["pp"]).sort_values(["n", "pp"]).iloc[0]
    return int(best["n"]), f"tp{best['tp']} pp{best['pp']}"


def search(req: Request) -> ServingResult:
    """Every candidate with its predictions, `meets` (fits and within budget), `pruned` (why
    not), `rank` (1 = best by the objective among those that meet) and `pareto`."""
    spec = catalog.get_model(req.model) if isinstance(req.model, str) else req.model
    _check(req, spec)
    gpu = catalog.get_gpu(req.gpu)
    node = req.gpus_per_node or gpu.cluster.domain
    layouts = _layouts(req, spec, node)
    if not layouts:
        raise UserError(
            f"gpus: no tp*pp split of {req.gpus} GPUs suits {spec.name} "
            f"({spec.heads} heads, {spec.kv} K/V heads, {spec.layers} layers)"
        )
    hardware = (gpu, catalog.cluster_for(gpu, req.gpus_per_node))
    out = predict(req, spec, hardware, layouts, _batches(req), req.gpus)
    fits = out["pred_fits"].astype(bool)
    if not fits.any():
        raise UserError(
            _batch_too_large(req, spec, hardware, layouts) or _no_fit_message(req, spec, node, out)
        )

    pruned = pd.Series("", index=out.index, dtype=object)
    pruned[~fits] = (
        "memory: "
        + out["pred_peak_mem_gib"].map("{:.1f}".format)
        + " of "
        + out["mem_capacity_gib"].map("{:.0f}".format)
        + " GiB"
    )
    for col, label, limit, kind in req.budget.limits():
        over = out[col] > limit if kind == "max" else out[col] < limit
        unit = "ms" if kind == "max" else "tokens/s"
        text = label + " " + out[col].map("{:,.0f}".format) + f" {'>' if kind == 'max' else '<'} "
        pruned[(pruned == "") & over] = text + f"{limit:,.0f} {unit}"
    out["pruned"] = pruned
    out["meets"] = pruned == ""
    # The front among the points that meet the budget (all that fit, when none does).
    meets = out["meets"] if out["meets"].any() else fits
    out["pareto"] = pareto_front(out, meets)
    out["miss"] = _miss(out, req.budget)
    if req.objective == "latency":
        keys, ascending = (
            ["meets", "pred_latency_ms", "pred_output_tokens_per_s_per_gpu"],
            [
                False,
                True,
                False,
            ],
        )
    else:
        keys, ascending = (
            ["meets", "pred_output_tokens_per_s_per_gpu", "pred_latency_ms"],
            [
                False,
                False,
                True,
            ],
        )
    out = out.sort_values([*keys, "tp", "pp"], ascending=[*ascending, True, True], kind="stable")
    out = out.reset_index(drop=True)
    n = int(out["meets"].sum())
    out["rank"] = pd.array([*range(1, n + 1), *([pd.NA] * (len(out) - n))], dtype="Int64")
    _, provenance = catalog.serving_constants(gpu)
    return ServingResult(
        request=req,
        model=spec,
        gpu=gpu,
        table=out,
        feasible=n,
        constants=provenance,
        closest=closest(out, req.budget) if n == 0 else "",
    )


def pareto_front(
    out: pd.DataFrame, eligible: pd.Series | None = None, col: str = "pred_latency_ms"
) -> pd.Series:
    """Eligible rows no other eligible row beats on both `col` (lower) and throughput per GPU
    (higher): in order of `col`, the rows that raise the best throughput seen so far."""
    rows = (out if eligible is None else out[eligible]).sort_values(
        [col, "pred_output_tokens_per_s_per_gpu"], ascending=[True, False]
    )
    tput = rows["pred_output_tokens_per_s_per_gpu"]
    best_before = tput.cummax().shift(1, fill_value=-np.inf)
    front = pd.Series(False, index=out.index)
    front[rows.index[(tput > best_before).to_numpy()]] = True
    return front


def _miss(out: pd.DataFrame, budget: Budget) -> pd.Series:
    """How far a fitting row is from the budget: its worst relative violation (0 = meets)."""
    worst = pd.Series(0.0, index=out.index)
    for col, _, limit, kind in budget.limits():
        ratio = out[col] / limit - 1 if kind == "max" else limit / out[col] - 1
        worst = np.maximum(worst, ratio.clip(lower=0))
    return worst.where(out["pred_fits"].astype(bool), np.inf)


def closest(out: pd.DataFrame, budget: Budget) -> str:
    """The fitting point that misses the budget least, and by how much on each bound."""
    row = out.loc[out["miss"].idxmin()]
    misses = []
    for col, label, limit, kind in budget.limits():
        value = float(row[col])
        if (kind == "max" and value > limit) or (kind == "min" and value < limit):
            unit = "ms" if kind == "max" else "tokens/s"
            pct = 100 * (value / limit - 1)
            misses.append(f"{label} {value:,.0f} {unit} vs {limit:,.0f} ({pct:+.0f}%)")
    return f"{label_of(row)}: " + "; ".join(misses)


def label_of(row: pd.Series) -> str:
    return (
        f"tp{int(row['tp'])} pp{int(row['pp'])} x{int(row['replicas'])} "
        f"batch {int(row['batch_size'])}"
    )


def _batch_too_large(
    req: Request,
    spec: ModelSpec,
    hardware: tuple[GPUSpec, ClusterSpec],
    layouts: list[tuple[int, int]],
) -> str | None:
    """When the --batch sizes asked for are what does not fit (smaller batches do), the line
    that says so; else None."""
    if not req.batches:
        return None  # the batches tried start at 1

    def fits(batches: np.ndarray) -> np.ndarray:
        pred = predict(req, spec, hardware, layouts, [int(b) for b in batches], req.gpus)
        by = pred.assign(fit=pred["pred_fits"].astype(bool)).groupby("batch_size")["fit"].any()
        return by.reindex(batches, fill_value=False).to_numpy()

    return no_fit.static(req, min(req.batches), fits)


def _no_fit_message(req: Request, spec: ModelSpec, node: int, out: pd.DataFrame) -> str:
    weights = float(out["mem_weights_gib"].min())
    need = min_gpus(req, spec, node)
    where = f"{req.gpus} {req.gpu} GPU{'s' if req.gpus > 1 else ''}"
    head = (
        f"gpus: {spec.name} does not fit on {where} at any tp/pp split "
        f"(weights alone {weights:.1f} GiB per GPU at best)"
    )
    if need is None:
        return head + "; no split up to 4 nodes holds it"
    n, split = need
    if n <= req.gpus:
        return f"{head}; {n} GPUs ({split}) would hold it: use a GPU count tp*pp divides"
    return (
        f"{head}; it needs at least {n} GPUs ({split}) for one sequence of "
        f"{req.input_len}+{req.output_len} tokens"
    )
