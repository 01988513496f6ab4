"""The inference search: every (tp, pp, batch, replicas) for the GPUs, predicted at once, checked
against memory and the latency/throughput budget, ranked by the objective, with the Pareto
front of end-to-end latency against throughput per GPU."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoconfig import catalog
from autoconfig.cost.inference import inference_constants
from autoconfig.errors import UserError
from autoconfig.frame import model_columns_for_frame
from autoconfig.serve.frame import KV_PRECISIONS, WEIGHT_PRECISIONS
from autoconfig.serve.predict import predict_frame
from autoconfig.specs import ModelSpec

OBJECTIVES = ("throughput", "latency")
DEFAULT_MAX_BATCH = 1024


@dataclass(frozen=True)
class Budget:
    """Upper bounds in milliseconds and a lower bound on the deployment's output tokens/s."""

    max_ttft_ms: float | None = None
    max_tpot_ms: float | None = None
    max_latency_ms: float | None = None
    min_throughput: float | None = None

    def check(self) -> None:
        for name, value in self.__dict__.items():
            if value is not None and not value > 0:
                flag = name.replace("_", "-")
                raise UserError(f"{flag}: must be a positive number (got {value:g})")

    def limits(self) -> list[tuple[str, str, float, str]]:
        """(column, label, limit, 'max' | 'min') of every bound that is set."""
        out = []
        for col, label, value, kind in (
            ("pred_ttft_ms", "TTFT", self.max_ttft_ms, "max"),
            ("pred_tpot_ms", "TPOT", self.max_tpot_ms, "max"),
            ("pred_latency_ms", "latency", self.max_latency_ms, "max"),
            ("pred_output_tokens_per_s", "throughput", self.min_throughput, "min"),
        ):
            if value is not None:
                out.append((col, label, float(value), kind))
        return out


@dataclass(frozen=True)
class Request:
    model: str | ModelSpec
    gpu: str
    gpus: int
    input_len: int
    output_len: int
    precision: str = "bf16"
    kv_precision: str = "auto"
    budget: Budget = Budget()
    objective: str = "throughput"
    max_batch: int = DEFAULT_MAX_BATCH
    batches: tuple[int, ...] | None = None
    gpus_per_node: int | None = None
    allow_tp_across_nodes: bool = False


def _check(req: Request, spec: ModelSpec) -> None:
    for name in ("gpus", "input_len", "output_len", "max_batch"):
        value = getattr(req, name)
        if value < 1:
            raise UserError(f"{name.replace('_', '-')}: must be a positive integer (got {value})")
    if req.precision not in WEIGHT_PRECISIONS:
        raise UserError(f"precision: must be one of {', '.join(WEIGHT_PRECISIONS)}")
    if req.kv_precision != "auto" and req.kv_precision not in KV_PRECISIONS:
        raise UserError(f"kv-precision: must be auto or one of {', '.join(KV_PRECISIONS)}")
    if req.objective not in OBJECTIVES:
        raise UserError(f"objective: must be one of {', '.join(OBJECTIVES)}")
    if req.batches is not None and any(b < 1 for b in req.batches):
        raise UserError("batch: batch sizes must be positive integers")
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


def _tp_degrees(spec: ModelSpec, limit: int, node: int, across: bool) -> list[int]:
    """TP degrees the heads allow: dividing the query heads, and dividing the K/V heads or
    a multiple of them (K/V heads are then replicated)."""
    out = []
    for tp in range(1, limit + 1):
        if spec.heads % tp or (spec.kv % tp and tp % spec.kv):
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


def _frame(req: Request, spec: ModelSpec, layouts: list[tuple[int, int]], batches: list[int]):
    tps = np.array([t for t, _ in layouts for _ in batches])
    pps = np.array([p for _, p in layouts for _ in batches])
    bs = np.tile(np.array(batches), len(layouts))
    base = {
        **model_columns_for_frame(spec),
        "gpu": req.gpu,
        "input_len": req.input_len,
        "output_len": req.output_len,
        "precision": req.precision,
        "kv_precision": req.kv_precision,
        "gpus_per_node": req.gpus_per_node if req.gpus_per_node else "",
    }
    frame = pd.DataFrame({"tp": tps, "pp": pps, "batch_size": bs})
    for key, value in base.items():
        frame[key] = value
    return frame


def _layouts(req: Request, spec: ModelSpec, node: int) -> list[tuple[int, int]]:
    out = []
    for tp in _tp_degrees(spec, req.gpus, node, req.allow_tp_across_nodes):
        if req.gpus % tp:
            continue
        for pp in range(1, min(req.gpus // tp, spec.layers) + 1):
            if (req.gpus // tp) % pp == 0:
                out.append((tp, pp))
    return out


def min_gpus(req: Request, spec: ModelSpec, node: int) -> tuple[int, str] | None:
    """The fewest GPUs on which one sequence of this length fits, and the split that does it."""
    layouts = [
        (tp, pp)
        for tp in _tp_degrees(spec, 4 * node, node, True)
        for pp in range(1, spec.layers + 1)
    ]
    frame = _frame(req, spec, layouts, [1])
    frame["num_gpus"] = frame["tp"] * frame["pp"]
    pred = predict_frame(frame)
    ok = pred[(pred["error"] == "") & (pred["pred_fits"] == True)]  # noqa: E712
    if ok.empty:
        return None
    best = ok.assign(n=ok["tp"] * ok["pp"]).sort_values(["n", "pp"]).iloc[0]
    return int(best["n"]), f"tp{best['tp']} pp{best['pp']}"


def search(req: Request) -> pd.DataFrame:
    """Every candidate with its predictions, `meets` (fits and within budget), `pruned` (why
    not), `rank` (1 = best by the objective among those that meet) and `pareto`."""
    spec = catalog.get_model(req.model) if isinstance(req.model, str) else req.model
    _check(req, spec)
    gpu = catalog.get_gpu(req.gpu)
    node = req.gpus_per_node or gpu.cluster.gpus_per_node
    layouts = _layouts(req, spec, node)
    if not layouts:
        raise UserError(
            f"gpus: no tp*pp split of {req.gpus} GPUs suits {spec.name} "
            f"({spec.heads} heads, {spec.kv} K/V heads, {spec.layers} layers)"
        )
    frame = _frame(req, spec, layouts, _batches(req))
    frame["num_gpus"] = req.gpus
    out = predict_frame(frame)
    bad = out["error"] != ""
    if bad.all():
        raise UserError(out.loc[bad, "error"].iloc[0])
    out = out[~bad].reset_index(drop=True)
    out["replicas"] = req.gpus // (out["tp"] * out["pp"])
    fits = out["pred_fits"].astype(bool)
    if not fits.any():
        raise UserError(_no_fit_message(req, spec, node, out))

    pruned = pd.Series("", index=out.index, dtype=object)
    pruned[~fits] = (
        "memory: "
        + out["pred_peak_mem_gb"].map("{:.1f}".format)
        + " of "
        + out["mem_capacity_gb"].map("{:.0f}".format)
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
    _, provenance = inference_constants(gpu)
    out.attrs.update(
        model=spec.name,
        gpu=gpu.name,
        gpus=req.gpus,
        input_len=req.input_len,
        output_len=req.output_len,
        precision=req.precision,
        kv_precision=req.kv_precision,
        objective=req.objective,
        budget={label: limit for _, label, limit, _ in req.budget.limits()},
        candidates=len(out),
        feasible=n,
        constants=provenance,
        closest=closest(out, req.budget) if n == 0 else "",
    )
    return out


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


def _no_fit_message(req: Request, spec: ModelSpec, node: int, out: pd.DataFrame) -> str:
    weights = float(out["mem_weights_gb"].min())
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
