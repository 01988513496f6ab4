"""The Python API: estimate one configuration or a table of runs, returning DataFrames."""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import ValidationError

from autoconfig import catalog
from autoconfig.advice import closest_fix
from autoconfig.cost import PREDICTION_COLUMNS, evaluate
from autoconfig.errors import UserError, pydantic_message
from autoconfig.frame import model_columns_for_frame, prepare, with_predictions
from autoconfig.rank import Constraints, cost_inputs, explain_winner, layout_label, rank
from autoconfig.space import enumerate_candidates, load_space
from autoconfig.specs import ModelSpec, ParallelConfig, SearchSpace


def estimate_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Predictions for every row of `runs` (reference-CSV columns).

    Returns the input columns followed by the pred_* columns, the memory and time breakdowns,
    and `error` ('' for rows that were estimated; the reason otherwise, with blank predictions).
    """
    return _estimate(runs)[0]


def _estimate(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    if runs.empty:
        empty = runs.assign(**{c: pd.Series(dtype=float) for c in PREDICTION_COLUMNS}, error="")
        return empty, pd.DataFrame()
    runs = runs.reset_index(drop=True)
    inputs, errors, resolved = prepare(runs)
    with np.errstate(all="ignore"):
        preds = evaluate(inputs)
    return with_predictions(runs, preds, errors), resolved


def estimate(
    model: str | ModelSpec,
    gpu: str,
    num_gpus: int,
    *,
    tp: int = 1,
    pp: int = 1,
    vp: int = 1,
    cp: int = 1,
    ep: int = 1,
    dp: int | None = None,
    sp: bool | None = None,
    mbs: int = 1,
    gbs: int | None = None,
    seq_len: int | None = None,
    recompute: str = "none",
    recompute_layers: int | None = None,
    zero: int = 1,
    precision: str = "bf16",
    flash_attention: bool = True,
    gpus_per_node: int | None = None,
    sp_saves_gathered: bool = False,
) -> pd.DataFrame:
    """One configuration's predictions and breakdown as a one-row DataFrame.

    Raises UserError with a one-line reason when the configuration is invalid.
    """
    spec = catalog.get_model(model) if isinstance(model, str) else model
    catalog.get_gpu(gpu)  # unknown names fail here with the closest names
    if num_gpus < 1:
        raise UserError(f"gpus: must be a positive integer (got {num_gpus})")
    dp = dp if dp is not None else num_gpus // max(tp * pp * cp, 1)
    try:  # the spec checks types and ranges and names the failing field
        cfg = ParallelConfig(
            dp=dp,
            tp=tp,
            pp=pp,
            vp=vp,
            cp=cp,
            ep=ep,
            sp=tp > 1 if sp is None else sp,
            mbs=mbs,
            gbs=gbs if gbs is not None else max(dp, 1) * mbs,
            seq_len=seq_len or spec.seq_len,
            recompute=recompute,
            recompute_layers=recompute_layers,
            zero=zero,
            precision=precision,
            flash_attention=flash_attention,
        )
    except ValidationError as exc:
        raise UserError(pydantic_message(exc)) from None
    yes_no = lambda flag: "y" if flag else "n"  # noqa: E731
    row = {
        **model_columns_for_frame(spec),
        **cfg.model_dump(exclude={"sp", "flash_attention", "overlap_grad_reduce"}),
        "gpu": gpu,
        "num_gpus": num_gpus,
        "gpus_per_node": gpus_per_node,
        "sp": yes_no(cfg.sp),
        "flash_attention": yes_no(cfg.flash_attention),
        "overlap_grad_reduce": yes_no(cfg.overlap_grad_reduce),
        "sp_saves_gathered": yes_no(sp_saves_gathered),
    }
    out, resolved = _estimate(pd.DataFrame([row]))
    if out.at[0, "error"]:
        raise UserError(out.at[0, "error"])
    # Show what was actually estimated (defaults resolved), not the placeholders.
    for col in ("dp", "sp", "mbs", "zero", "recompute", "precision", "flash_attention"):
        out[col] = resolved[col].to_numpy()
    return out


def default_gbs(model: ModelSpec, seq_len: int, gpus: int) -> int:
    """A batch of about 4M tokens for large models (2M under 20B parameters), in a power of two
    of sequences, the order of batch the GPT-3 and Llama 3 papers trained with."""
    tokens = 4 * 2**20 if model.param_count() >= 20e9 else 2 * 2**20
    gbs = 2 ** max(0, round(np.log2(tokens / seq_len)))
    while gbs * 8 < gpus:  # room for data parallelism on very large clusters (Llama 3 405B
        gbs *= 2  # trained with 16M-token batches on 16K GPUs)
    return int(gbs)


def search(
    model: str | ModelSpec,
    gpus: int,
    gpu: str = "h100-sxm-80gb",
    *,
    seq_len: int | None = None,
    gbs: int | None = None,
    precision: str = "bf16",
    space: SearchSpace | str | None = None,
    fix: dict[str, object] | None = None,
    max_tp: int | None = None,
    max_pp: int | None = None,
    min_dp: int | None = None,
    max_memory_gb: float | None = None,
    memory_headroom: float = 0.0,
    gpus_per_node: int | None = None,
    flash_attention: bool = True,
) -> pd.DataFrame:
    """Every valid layout for `gpus` GPUs, evaluated and ranked (feasible first, best first).

    The frame's `attrs` hold the search's context: enumerated and dropped counts, the batch
    used (and whether it was chosen for the user), the winner's explanation, and advice when
    nothing fits.
    """
    spec = catalog.get_model(model) if isinstance(model, str) else model
    gpu_spec = catalog.get_gpu(gpu)
    if gpus < 1:
        raise UserError(f"gpus: must be a positive integer (got {gpus})")
    if not 0 <= memory_headroom < 1:
        raise UserError(f"memory-headroom: must be a fraction in [0, 1) (got {memory_headroom})")
    if precision == "fp8" and "fp8" not in gpu_spec.peak_tflops:
        raise UserError(f"precision: {gpu} has no fp8 tensor cores")
    cluster = catalog.cluster_for(gpu_spec, gpus_per_node)
    seq = seq_len or spec.seq_len
    if spec.max_seq_len and seq > spec.max_seq_len:
        raise UserError(f"seq-len: {seq} exceeds {spec.name}'s context of {spec.max_seq_len}")
    chosen_gbs = gbs is None
    batch = gbs if gbs is not None else default_gbs(spec, seq, gpus)
    if batch < 1:
        raise UserError(f"gbs: must be a positive integer (got {batch})")
    space_spec = space if isinstance(space, SearchSpace) else load_space(space)
    fixed = _check_fixed(fix or {})
    if max_tp is not None and min(space_spec.tp) > max_tp:
        raise UserError(f"max-tp: {max_tp} is below every tp in the space {space_spec.tp}")
    if "tp" in fixed and max_tp is not None and int(fixed["tp"]) > max_tp:
        raise UserError(f"fix: tp={fixed['tp']} contradicts --max-tp {max_tp}")
    if "pp" in fixed and max_pp is not None and int(fixed["pp"]) > max_pp:
        raise UserError(f"fix: pp={fixed['pp']} contradicts --max-pp {max_pp}")

    constraints = Constraints(fixed, max_tp, max_pp, min_dp, max_memory_gb, memory_headroom)
    ranked = _search_core(
        spec,
        gpus,
        gpu_spec,
        cluster,
        precision,
        batch,
        seq,
        space_spec,
        constraints,
        flash_attention,
    )
    ranked.attrs["gbs_chosen"] = chosen_gbs
    if not ranked.attrs["feasible"]:
        advice = closest_fix(
            ranked, spec, gpu_spec, cluster, precision, batch, seq, flash_attention
        )
        for factor in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
            more = gpus * factor
            more_batch = batch if gbs is not None else default_gbs(spec, seq, more)
            try:
                bigger = _search_core(
                    spec,
                    more,
                    gpu_spec,
                    cluster,
                    precision,
                    more_batch,
                    seq,
                    space_spec,
                    constraints,
                    flash_attention,
                )
            except UserError:
                continue
            if bigger.attrs["feasible"]:
                top = bigger.iloc[0]
                advice.append(
                    f"  with {more} GPUs (gbs {more_batch}): {layout_label(top)} "
                    f"fits at {top['pred_peak_mem_gb']:.1f} GiB"
                )
                break
        ranked.attrs["advice"] = advice
    return ranked


def _search_core(
    spec: ModelSpec,
    gpus: int,
    gpu_spec,
    cluster,
    precision: str,
    batch: int,
    seq: int,
    space_spec: SearchSpace,
    constraints: Constraints,
    flash_attention: bool,
) -> pd.DataFrame:
    """Enumerate, evaluate and rank; raises UserError when no layout uses the GPUs."""
    cands = enumerate_candidates(spec, gpus, batch, seq, space_spec, cluster.gpus_per_node)
    if cands.table.empty:
        reasons = ", ".join(f"{k} ({v})" for k, v in cands.dropped.items())
        raise UserError(
            f"gpus: no layout of {spec.name} uses {gpus} GPUs with gbs {batch} (dropped: {reasons})"
        )
    inputs = cost_inputs(
        spec, gpu_spec, cluster, precision, cands.table, batch, seq, flash_attention
    )
    with np.errstate(all="ignore"):
        ranked = rank(cands.table, inputs, constraints)
    feasible = int((ranked["pruned"] == "").sum())
    ranked.attrs.update(
        model=spec.name,
        gpu=gpu_spec.name,
        gpus=gpus,
        seq_len=seq,
        gbs=batch,
        gbs_chosen=False,
        precision=precision,
        layers=spec.layers,
        enumerated=cands.enumerated,
        dropped=cands.dropped,
        evaluated=len(ranked),
        feasible=feasible,
        pruned=ranked.loc[ranked["pruned"] != "", "pruned"]
        .str.split(":")
        .str[0]
        .value_counts()
        .to_dict(),
        explanation=explain_winner(ranked),
        advice=[],
    )
    return ranked


FIXABLE = {
    "dp": int,
    "tp": int,
    "pp": int,
    "vp": int,
    "cp": int,
    "ep": int,
    "mbs": int,
    "zero": int,
    "recompute": str,
    "sp": bool,
}


def _check_fixed(fix: dict[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in fix.items():
        if key not in FIXABLE:
            raise UserError(f"fix: unknown key '{key}' (allowed: {', '.join(FIXABLE)})")
        kind = FIXABLE[key]
        try:
            if kind is bool:
                text = str(value).lower()
                if text not in ("true", "false", "1", "0", "y", "n"):
                    raise ValueError
                out[key] = text in ("true", "1", "y")
            else:
                out[key] = kind(value)
        except ValueError:
            raise UserError(f"fix: {key} must be {kind.__name__} (got '{value}')") from None
        if kind is str and out[key] not in ("none", "selective", "full", "op"):
            raise UserError(f"fix: recompute must be none, selective, full or op (got '{value}')")
    return out


def infer_frame(points: pd.DataFrame) -> pd.DataFrame:
    """Serving predictions for every row of `points` (inference_runs.csv columns): the input
    columns, then pred_ttft_ms, pred_tpot_ms, pred_latency_ms, pred_output_tokens_per_s_per_gpu,
    pred_fits, the breakdowns, and `error` ('' or the row's reason)."""
    from autoconfig.serve.predict import predict_frame

    return predict_frame(points)


def infer(
    model: str | ModelSpec,
    gpu: str,
    gpus: int,
    *,
    input_len: int,
    output_len: int,
    max_ttft_ms: float | None = None,
    max_tpot_ms: float | None = None,
    max_latency_ms: float | None = None,
    min_throughput: float | None = None,
    objective: str = "throughput",
    precision: str = "bf16",
    kv_precision: str = "auto",
    max_batch: int = 1024,
    batches: tuple[int, ...] | None = None,
    gpus_per_node: int | None = None,
    allow_tp_across_nodes: bool = False,
) -> pd.DataFrame:
    """Every (tp, pp, batch, replicas) serving candidate on `gpus` GPUs, best first.

    Columns: the layout, pred_* figures, memory and time breakdowns, `meets` (fits and within
    the budget), `pruned` (why not), `rank`, `pareto`. `attrs` holds the inputs, the count that
    meets the budget, and `closest` (the nearest miss) when none does. Raises UserError with
    one line for bad input, including a model that fits on no split of the GPUs.
    """
    from autoconfig.serve.search import Budget, Request, search

    return search(
        Request(
            model=model,
            gpu=gpu,
            gpus=gpus,
            input_len=input_len,
            output_len=output_len,
            precision=precision,
            kv_precision=kv_precision,
            budget=Budget(max_ttft_ms, max_tpot_ms, max_latency_ms, min_throughput),
            objective=objective,
            max_batch=max_batch,
            batches=batches,
            gpus_per_node=gpus_per_node,
            allow_tp_across_nodes=allow_tp_across_nodes,
        )
    )
